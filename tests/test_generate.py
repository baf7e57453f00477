"""KV-cache decoding and sampling: parity with full forwards, filters, stopping rules."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.config import ModelConfig
from kiln.model import Transformer
from kiln.model.sampling import filter_logits, generate

VOCAB, MAX_LEN = 50, 32


@pytest.fixture
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_seq_len=MAX_LEN, init_std=0.3)  # large weights: peaked, distinct logits
    return Transformer(cfg).eval()


def test_kv_cache_matches_full_forward_at_every_position(model):
    tokens = torch.randint(0, VOCAB, (1, MAX_LEN))
    with torch.no_grad():
        full = model(tokens)
        caches = model.new_caches()
        prefill = 5
        steps = [model(tokens[:, :prefill], caches)]
        steps += [model(tokens[:, t : t + 1], caches) for t in range(prefill, MAX_LEN)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_greedy_equals_argmax_recomputed_without_cache(model):
    prompt = [3, 14, 15, 9]
    out = generate(model, prompt, max_new_tokens=12, temperature=0.0)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt):]


def test_top_k_keeps_the_k_largest_and_their_ties():
    logits = torch.randn(4, VOCAB)
    kept = torch.isfinite(filter_logits(logits, top_k=5))
    assert kept.sum(-1).tolist() == [5] * 4
    assert torch.equal(kept.nonzero()[:, 1].view(4, 5).sort(-1).values,
                       logits.topk(5).indices.sort(-1).values)
    # ties with the k-th largest stay (as in transformers): equal logits, equal probability
    assert torch.isfinite(filter_logits(torch.zeros(VOCAB), top_k=3)).sum() == VOCAB


def test_top_p_keeps_smallest_set_reaching_mass():
    # probabilities 0.15, 0.5, 0.05, 0.3 (deliberately unsorted)
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log()
    kept = {p: torch.isfinite(filter_logits(logits, top_p=p)).nonzero().flatten().tolist()
            for p in (0.4, 0.75, 0.85, 0.97, 1.0)}
    assert kept == {0.4: [1], 0.75: [1, 3], 0.85: [0, 1, 3], 0.97: [0, 1, 2, 3],
                    1.0: [0, 1, 2, 3]}
    # top-k first, then the nucleus over the renormalised survivors: 0.5/0.8 = 0.625 >= 0.6
    assert torch.isfinite(filter_logits(logits, top_k=2, top_p=0.6)).nonzero().flatten().tolist() == [1]
    # kept logits are unchanged
    assert filter_logits(logits, top_p=0.75)[1] == pytest.approx(math.log(0.5))


def test_filter_rejects_bad_arguments():
    with pytest.raises(ValueError):
        filter_logits(torch.zeros(4), top_p=0.0)
    with pytest.raises(ValueError):
        filter_logits(torch.zeros(4), top_k=-1)


def test_seeded_sampling_is_reproducible(model):
    def sample(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return generate(model, [1, 2, 3], 20, temperature=2.0, top_k=20, top_p=0.95, generator=gen)

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


@pytest.mark.parametrize("temperature", [1e-45, 1e-300])
def test_a_vanishing_temperature_samples_greedily(model, temperature):
    """logits / 1e-300 overflow to inf, and softmax of infs is NaN: the config allows any
    temperature > 0, so the sampler must reach the greedy limit instead of failing."""
    gen = torch.Generator().manual_seed(0)
    prompt = [3, 14, 15, 9]
    assert (generate(model, prompt, 12, temperature=temperature, generator=gen)
            == generate(model, prompt, 12, temperature=0.0))


def test_stops_at_eos(model):
    free = generate(model, [4, 5], 15, temperature=0.0)
    eos = free[3]
    cut = free.index(eos)  # the first time greedy decoding emits it
    assert generate(model, [4, 5], 15, temperature=0.0, eos_id=eos) == free[: cut + 1]


def test_respects_max_seq_len_and_restores_mode(model):
    model.train()
    prompt = list(range(MAX_LEN - 4))
    assert len(generate(model, prompt, 100, temperature=0.0)) == 4
    assert model.training
    assert generate(model, list(range(MAX_LEN)), 5, temperature=0.0) == []
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, list(range(MAX_LEN + 1)), 5)


def test_a_prompts_sample_does_not_depend_on_the_prompts_before_it(tiny_run):
    """`kiln generate` draws each prompt's sample from its own generator."""
    import json

    from conftest import tiny_config

    from kiln.cli import cmd_generate
    from kiln.data.tokenizer import load_tokenizer
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    tok = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json")
    long = ""
    while len(tok.encode(long).ids) < 58:  # the context (64) leaves it < 12 new tokens
        long += "x = 1\\n"
    completions = []
    for first in ("def ", long):  # the first prompts draw 12 and <= 6 random numbers
        cfg = tiny_config(tiny_run, f"generate.prompts={[first, 'class ']!r}".replace("'", '"'),
                          "generate.temperature=1.0", "generate.top_k=0", "generate.top_p=1.0",
                          "generate.max_new_tokens=12")
        cmd_generate(cfg)
        completions.append(json.loads((tiny_run / "samples.json").read_text()))
    assert len(tok.encode(completions[1][0]["completion"]).ids) <= 6
    assert completions[0][1] == completions[1][1]
    # nor on its place in the list; a repeated prompt draws another sample
    cmd_generate(tiny_config(tiny_run, 'generate.prompts=["class ", "class "]',
                             "generate.temperature=1.0", "generate.top_k=0",
                             "generate.top_p=1.0", "generate.max_new_tokens=12"))
    alone, repeated = json.loads((tiny_run / "samples.json").read_text())
    assert alone == completions[0][1]
    assert repeated["completion"] != alone["completion"]
    cmd_generate(tiny_config(tiny_run, f"run.seed={2**45}"))  # any seed training takes


def test_sampling_draws_from_the_tempered_filtered_distribution():
    """Many single-step draws: top_k and top_p keep exactly their candidates, and the draw
    frequencies follow softmax(logits / temperature) over what is kept (a chi-square bound)."""
    from kiln.model.sampling import _next_token

    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    gen = torch.Generator().manual_seed(0)
    n = 20_000

    def draws(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        ids = [_next_token(logits, temperature, top_k, top_p, gen) for _ in range(n)]
        return torch.bincount(torch.tensor(ids), minlength=len(logits)).double()

    def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
        kept = probs > 0
        expected = probs[kept] * n
        return float(((counts[kept] - expected) ** 2 / expected).sum())

    for temperature in (0.5, 2.0):
        counts = draws(temperature=temperature)
        probs = (logits.double() / temperature).softmax(-1)
        assert chi2(counts, probs) < 30, temperature  # 7 dof: p < 1e-4 by chance
        # the other temperature's distribution is rejected: the temperature is applied
        assert chi2(counts, (logits.double() / (2.5 - temperature)).softmax(-1)) > 200
    counts = draws(top_k=3)
    top3 = torch.cat([logits[:3].double().softmax(-1), torch.zeros(5, dtype=torch.float64)])
    assert counts[3:].sum() == 0 and chi2(counts, top3) < 20
    probs = logits.double().softmax(-1)  # nucleus 0.7: the smallest prefix reaching 70% of mass
    keep = int((probs.cumsum(-1) - probs < 0.7).sum())
    counts = draws(top_p=0.7)
    assert counts[keep:].sum() == 0 and (counts[:keep] > 0).all()


def test_an_empty_prompt_samples_a_document_from_its_start(tiny_run, monkeypatch):
    """`""` is the start of a document: the model sees the EOS that ends the one before,
    as in training (documents are EOS-separated), and its sample is what follows it."""
    import json

    from conftest import tiny_config

    import kiln.model.sampling
    from kiln.cli import cmd_generate
    from kiln.data.tokenizer import eos_id, load_tokenizer
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    eos = eos_id(load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json"))
    seen: list[list[int]] = []
    real = kiln.model.sampling.generate

    def spy(model, ids, *args, **kwargs):
        seen.append(list(ids))
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(kiln.model.sampling, "generate", spy)  # cmd_generate imports it per call
    cmd_generate(tiny_config(tiny_run, 'generate.prompts=["", "def "]', "generate.max_new_tokens=6"))
    assert seen[0] == [eos] and seen[1] != [eos] and len(seen) == 2
    samples = json.loads((tiny_run / "samples.json").read_text())
    assert samples[0]["prompt"] == "" and samples[0]["completion"]


def test_a_padded_vocabulary_never_samples_ids_the_tokenizer_lacks(tiny_run, monkeypatch):
    """model.vocab_size may pad the vocabulary past the tokenizer's: the padded rows are
    never a target, yet they get probability, and the tokenizer decodes such ids to nothing
    (the sample would lose them silently). `kiln generate` draws only the tokenizer's ids."""
    from conftest import tiny_config

    import kiln.model.sampling
    from kiln.cli import cmd_generate
    from kiln.data.tokenizer import load_tokenizer
    from kiln.train.trainer import Trainer

    padded = ("model.vocab_size=1024",)  # the tokenizer has 512: half the rows are padding
    Trainer(tiny_config(tiny_run, "train.steps=2", *padded)).fit()
    vocab = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json").get_vocab_size()
    drawn: list[int] = []
    real = kiln.model.sampling.generate

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        drawn.extend(out)
        return out

    monkeypatch.setattr(kiln.model.sampling, "generate", spy)  # cmd_generate imports it per call
    cmd_generate(tiny_config(tiny_run, *padded, "generate.temperature=1.0", "generate.top_k=0",
                             "generate.top_p=1.0", "generate.max_new_tokens=40"))
    assert len(drawn) >= 40 and max(drawn) < vocab


def test_a_prompt_too_long_is_refused_before_any_prompt_is_sampled(tiny_run, monkeypatch):
    """`kiln generate` checks every prompt first: one that fills the context, last in the
    list, must not cost the time of sampling all the others before the error."""
    from conftest import tiny_config

    import kiln.model.sampling
    from kiln.cli import cmd_generate
    from kiln.config import ConfigError
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    sampled: list[list[int]] = []
    monkeypatch.setattr(kiln.model.sampling, "generate",
                        lambda model, ids, *a, **k: sampled.append(ids) or [])
    long = "x = 1\\n" * 64  # well past the model's 64-token context
    with pytest.raises(ConfigError, match="leaves no room in the model's context"):
        cmd_generate(tiny_config(tiny_run, f'generate.prompts=["def ", "{long}"]'))
    assert sampled == [] and not (tiny_run / "samples.json").exists()


def test_greedy_samples_record_greedy_not_the_unused_top_k_and_top_p(tiny_run):
    """At temperature 0 top_k and top_p play no part: samples.json says greedy instead."""
    import json

    from conftest import tiny_config

    from kiln.cli import cmd_generate
    from kiln.train.trainer import Trainer

    Trainer(tiny_config(tiny_run, "train.steps=2")).fit()
    cmd_generate(tiny_config(tiny_run, "generate.temperature=0.0", "generate.top_k=50",
                             "generate.top_p=0.9"))
    [*_, sample] = json.loads((tiny_run / "samples.json").read_text())
    assert {k: sample.get(k) for k in ("temperature", "decoding", "top_k", "top_p")} == \
        {"temperature": 0.0, "decoding": "greedy", "top_k": None, "top_p": None}
    cmd_generate(tiny_config(tiny_run, "generate.temperature=0.7", "generate.top_k=50",
                             "generate.top_p=0.9"))
    [*_, sample] = json.loads((tiny_run / "samples.json").read_text())
    assert {k: sample.get(k) for k in ("temperature", "decoding", "top_k", "top_p")} == \
        {"temperature": 0.7, "decoding": None, "top_k": 50, "top_p": 0.9}


@pytest.mark.parametrize("temperature", [-0.5, math.nan])
def test_a_temperature_that_is_not_a_number_at_or_above_zero_is_refused(model, temperature):
    """Called directly (the config refuses these at load), generate names the temperature
    rather than failing later inside torch.multinomial on NaN probabilities."""
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, [1, 2], max_new_tokens=3, temperature=temperature)


def test_a_prompt_is_encoded_as_the_shards_were_without_a_templates_specials(tmp_path):
    """A tokenizer.json brought in with a template adding a BOS (here EOS, as many do): the
    shards are encoded without it, so a prompt must be too (it had a BOS training never
    put before a document's first token)."""
    from tokenizers.processors import TemplateProcessing

    from kiln.commands.generate import _prompt_ids
    from kiln.data.tokenizer import EOS_TOKEN, eos_id, load_tokenizer, train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x + 1\n"] * 20, 300, tmp_path / "t.json",
                          show_progress=False)
    tok.post_processor = TemplateProcessing(single=f"{EOS_TOKEN} $A",
                                             special_tokens=[(EOS_TOKEN, eos_id(tok))])
    tok.save(str(tmp_path / "t.json"))
    tok = load_tokenizer(tmp_path / "t.json")
    assert tok.encode("return x").ids[0] == eos_id(tok)  # the template is in force
    assert _prompt_ids(tok, "return x", 64) == tok.encode("return x", add_special_tokens=False).ids
