"""Perplexity scoring with a Kiln checkpoint, surplexity selection, and the Kiln label judge."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import get_filter_result

from kiln.config import config_to_toml, load_config
from kiln.data.filters import (
    KilnLabelJudge,
    PerplexityScorer,
    PerplexitySelector,
    quantile_band,
    scores_from,
    threshold_for_count,
    threshold_for_fraction,
)
from kiln.data.filters.run_model import continuation_nll
from kiln.data.tokenizer import eos_id, train_tokenizer
from kiln.model import Transformer
from kiln.parallel.distributed import DistEnv
from kiln.train.checkpoint import save_checkpoint

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "birds sing at dawn"] * 10
DOCS = ["the cat ran on the mat at dawn", "a bird", "zq xv kj qq zz the", "park park park"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A fake trained run: config.toml, tokenizer, tokens/index.json and one checkpoint."""
    run = tmp_path_factory.mktemp("ppl_run")
    tok = train_tokenizer(TEXTS, 300, run / "tokenizer" / "tokenizer.json", show_progress=False)
    vocab = tok.get_vocab_size()
    cfg = load_config(None, [f'run.dir="{run}"', f"model.vocab_size={vocab}", "model.dim=32",
                             "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
                             "model.max_seq_len=48", "train.seq_len=8"])
    (run / "config.toml").write_text(config_to_toml(cfg))
    (run / "tokens").mkdir()
    (run / "tokens" / "index.json").write_text(json.dumps({"vocab_size": vocab}))
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    save_checkpoint(run / "checkpoints", 5, model, torch.optim.SGD(model.parameters(), lr=0.1),
                    {"step": 5}, DistEnv())
    return run, model.eval(), tok


def direct_ppl(model, tok, text, limit):
    ids = tok.encode(text).ids[:limit]
    inp = torch.tensor([[eos_id(tok)] + ids[:-1]])
    with torch.no_grad():
        logp = torch.log_softmax(model(inp)[0].double(), dim=-1)
    nll = -logp[torch.arange(len(ids)), torch.tensor(ids)].mean().item()
    return math.exp(nll), len(ids)


def test_scorer_matches_direct_computation_batched_and_truncated(run_dir):
    run, model, tok = run_dir
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(DOCS)]
    list(PerplexityScorer(run, batch_size=3).run(iter(docs)))  # batches of 3 and 1, padded
    for doc in docs:
        ppl, n = direct_ppl(model, tok, doc.text, limit=48)  # default: max_seq_len
        assert doc.metadata["ppl"] == pytest.approx(ppl, rel=1e-5)
        assert doc.metadata["ppl_tokens"] == n
        assert doc.metadata["nll"] == pytest.approx(math.log(ppl), rel=1e-5)
    long = Document(text=" ".join(DOCS), id="long")
    scorer = PerplexityScorer(run, batch_size=1, max_tokens_per_doc=5)
    list(scorer.run(iter([long])))
    assert pickle.loads(pickle.dumps(scorer))._loaded is None  # workers get no model copy
    assert long.metadata["ppl_tokens"] == 5
    assert long.metadata["ppl"] == pytest.approx(direct_ppl(model, tok, long.text, 5)[0], rel=1e-5)


def test_a_model_scores_as_many_tokens_as_its_context(run_dir):
    """Scoring n tokens feeds EOS + n - 1 tokens: a max_seq_len-48 model scores 48 tokens
    of a long document (the old limit, max_seq_len - 1, refused 48 and cut the default to 47)."""
    run, model, tok = run_dir
    text = " ".join(DOCS * 8)
    assert len(tok.encode(text).ids) > 48
    for limit in (None, 48):
        long = Document(text=text, id="long")
        list(PerplexityScorer(run, batch_size=1, max_tokens_per_doc=limit).run(iter([long])))
        assert long.metadata["ppl_tokens"] == 48
        assert long.metadata["ppl"] == pytest.approx(direct_ppl(model, tok, text, 48)[0], rel=1e-5)


def test_scoring_adds_no_post_processor_tokens(run_dir, tmp_path):
    """Training encodes documents without the tokenizer's post-processor tokens; a
    tokenizer.json with a template ("$A <|endoftext|>") must not add a scored EOS to every
    document or to the judge's labels (before: ppl_tokens was n + 1)."""
    import shutil

    run, model, tok = run_dir
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = copy / "tokenizer" / "tokenizer.json"
    spec = json.loads(path.read_text())
    eos = {"id": "<|endoftext|>", "type_id": 0}
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                         {"SpecialToken": eos}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                       {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<|endoftext|>": {
                                  "id": "<|endoftext|>", "ids": [eos_id(tok)],
                                  "tokens": ["<|endoftext|>"]}}}
    path.write_text(json.dumps(spec))
    doc = Document(text=DOCS[0], id="d")
    list(PerplexityScorer(copy, batch_size=1).run(iter([doc])))
    ppl, n = direct_ppl(model, tok, DOCS[0], limit=48)
    assert doc.metadata["ppl_tokens"] == n == len(tok.encode(DOCS[0]).ids)
    assert doc.metadata["ppl"] == pytest.approx(ppl, rel=1e-5)
    judge = KilnLabelJudge(copy, template="post: {text} ->")
    assert judge.prompt_ids("the cat sat") == KilnLabelJudge(run, template="post: {text} ->"
                                                             ).prompt_ids("the cat sat")


def test_default_truncation_is_the_papers_512_tokens_where_the_model_holds_them(run_dir,
                                                                              monkeypatch):
    """The fixture's model holds 47 tokens, so 512 never binds there: shrink the paper's
    limit below the model's room and check the default scorer applies it."""
    import kiln.data.filters.perplexity as perplexity

    run, model, tok = run_dir
    monkeypatch.setattr(perplexity, "PAPER_MAX_TOKENS", 6)
    long = Document(text=" ".join(DOCS), id="long")
    list(PerplexityScorer(run, batch_size=1).run(iter([long])))
    assert long.metadata["ppl_tokens"] == 6
    assert long.metadata["ppl"] == pytest.approx(direct_ppl(model, tok, long.text, 6)[0], rel=1e-5)
    monkeypatch.undo()
    assert perplexity.PAPER_MAX_TOKENS == 512  # the paper's truncation


def test_scorer_empty_doc_and_bad_arguments(run_dir, tmp_path):
    run, _, _ = run_dir
    empty = Document(text="", id="e")
    list(PerplexityScorer(run).run(iter([empty])))
    assert empty.metadata["ppl"] is None and empty.metadata["ppl_tokens"] == 0
    with pytest.raises(ValueError, match="does not fit"):
        list(PerplexityScorer(run, max_tokens_per_doc=49).run(iter([Document("x y", "x")])))
    with pytest.raises(FileNotFoundError, match="not a trained Kiln run"):
        PerplexityScorer(tmp_path)


class Uniform(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab)


class NextId(Uniform):
    """Puts (almost) all mass on token id + 1: perfect on counting sequences."""

    def forward(self, tokens):
        return 60.0 * torch.nn.functional.one_hot((tokens + 1) % self.vocab, self.vocab).float()


def test_ppl_of_uniform_model_is_vocab_and_of_perfect_model_is_one():
    (nats, n), = continuation_nll(Uniform(37), [[0]], [[5, 9, 2, 2]])
    assert n == 4 and math.exp(nats / n) == pytest.approx(37.0, rel=1e-6)
    (nats, n), = continuation_nll(NextId(37), [[3]], [[4, 5, 6, 7, 8]])
    assert math.exp(nats / n) == pytest.approx(1.0, abs=1e-9)
    (nats, n), = continuation_nll(NextId(37), [[3]], [[9, 5]])  # wrong tokens: huge NLL
    assert nats / n > 20


def test_threshold_for_fraction_keeps_exactly_the_top_fraction():
    scores = [float(s) for s in torch.randperm(100).tolist()]
    for fraction, k in [(0.0, 0), (0.1, 10), (0.29, 29), (0.333, 33), (1.0, 100)]:
        t = threshold_for_fraction(scores, fraction)
        assert sum(s >= t for s in scores) == k
        assert sorted(s for s in scores if s >= t) == sorted(scores)[100 - k:]
    with pytest.raises(ValueError):
        threshold_for_fraction(scores, 1.5)
    with pytest.raises(ValueError, match="finite"):
        threshold_for_fraction([1.0, float("nan")], 0.5)


def test_ties_at_threshold_are_all_kept():
    scores = [5.0, 4.0, 4.0, 4.0, 1.0]
    t = threshold_for_count(scores, 2)  # the 2nd largest is 4.0, tied three times
    assert t == 4.0 and sum(s >= t for s in scores) == 4


def selector_keeps(selector, scores):
    docs = [Document(text="t", id=str(i), metadata={"ppl": s}) for i, s in enumerate(scores)]
    return [d.metadata["ppl"] for d in docs if get_filter_result(selector.filter(d))[0]]


def test_selector_modes_on_known_pool():
    pool = [12.0, 3.0, 40.0, 7.5, 25.0, 1.5, 90.0, 18.0, 5.0, 60.0]
    top = PerplexitySelector("top_fraction", fraction=0.3, scores=pool)
    assert sorted(selector_keeps(top, pool)) == [40.0, 60.0, 90.0]  # highest surprise (MPP)
    bottom = PerplexitySelector("bottom_fraction", fraction=0.2, scores=pool)
    assert sorted(selector_keeps(bottom, pool)) == [1.5, 3.0]
    low, high = quantile_band(pool, 0.1, 0.9)
    band = PerplexitySelector("drop_extremes", low_q=0.1, high_q=0.9, scores=pool)
    assert selector_keeps(band, pool) == [s for s in pool if low <= s <= high]
    assert 1.5 not in selector_keeps(band, pool) and 90.0 not in selector_keeps(band, pool)
    fixed = PerplexitySelector("top_fraction", threshold=25.0)  # re-threshold, no rescoring
    assert sorted(selector_keeps(fixed, pool)) == [25.0, 40.0, 60.0, 90.0]


def test_selector_keeps_a_count_the_papers_ndoc():
    """MPP keeps the ndoc most surprising documents of the pool; the converse the ndoc least."""
    pool = [12.0, 3.0, 40.0, 7.5, 25.0, 1.5, 90.0, 18.0, 5.0, 60.0]
    assert sorted(selector_keeps(PerplexitySelector("top_fraction", count=4, scores=pool),
                                 pool)) == [25.0, 40.0, 60.0, 90.0]
    assert sorted(selector_keeps(PerplexitySelector("bottom_fraction", count=3, scores=pool),
                                 pool)) == [1.5, 3.0, 5.0]
    with pytest.raises(ValueError, match="count 11 is more than the 10 scored"):
        PerplexitySelector("top_fraction", count=11, scores=pool)
    with pytest.raises(ValueError, match="exactly one of threshold, fraction or count"):
        PerplexitySelector("top_fraction", count=2, fraction=0.5, scores=pool)


def test_selector_missing_scores_and_bad_config():
    sel = PerplexitySelector("top_fraction", threshold=1.0)
    assert get_filter_result(sel.filter(Document("", "e", metadata={"ppl": None}))) == (
        False, "ppl_missing")
    with pytest.raises(KeyError, match="PerplexityScorer"):
        sel.filter(Document("x", "u"))
    with pytest.raises(ValueError):
        PerplexitySelector("top_fraction", fraction=0.5)  # no scores
    with pytest.raises(ValueError):
        PerplexitySelector("median")
    with pytest.raises(KeyError):
        scores_from([Document("x", "u")])


def test_kiln_label_judge_is_softmax_over_label_likelihoods(run_dir):
    run, model, tok = run_dir
    judge = KilnLabelJudge(run, template="post: {text} ->")
    text = "the cat sat"
    prompt = judge.prompt_ids(text)
    labels = [tok.encode(" JUNK").ids, tok.encode(" HIGH-QUALITY").ids]

    def logp(target):
        seq = torch.tensor([prompt + target])
        with torch.no_grad():
            lp = torch.log_softmax(model(seq[:, :-1])[0].double(), dim=-1)
        pos = torch.arange(len(prompt) - 1, seq.shape[1] - 1)
        return lp[pos, seq[0, pos + 1]].sum().item()

    expected = 1 / (1 + math.exp(logp(labels[1]) - logp(labels[0])))
    assert judge.judge(text).junk_score == pytest.approx(expected, rel=1e-6)
    long = judge.prompt_ids("word " * 200)  # the post is truncated to fit max_seq_len
    assert len(long) + max(map(len, labels)) - 1 == 48  # the model reads prompt + label[:-1]
    # the head and the post are one text to the tokenizer, as in training: no lone space
    assert prompt == tok.encode("post: the cat sat").ids + tok.encode(" ->").ids


def test_the_judge_fills_the_models_context_and_no_more(run_dir, monkeypatch):
    """`continuation_nll` feeds prompt + label[:-1]: the last label token is predicted, not
    read. The post was cut one token short of that (the model read 47 of its 48 positions);
    the longer label's row now reads exactly max_seq_len tokens, and the judge runs."""
    run, model, tok = run_dir
    judge = KilnLabelJudge(run, template="post: {text} ->")
    widths: list[int] = []
    loaded = judge._load()[0]
    real = type(loaded).forward
    monkeypatch.setattr(type(loaded), "forward",
                        lambda self, x, *a, **k: widths.append(x.shape[1]) or real(self, x, *a, **k))
    verdict = judge.judge("word " * 200)
    assert widths == [48] and verdict.junk_score is not None
    longer, tail = len(tok.encode(" HIGH-QUALITY").ids), tok.encode(" ->").ids
    assert longer >= len(tok.encode(" JUNK").ids)
    assert judge.prompt_ids("word " * 200) == \
        tok.encode("post: " + "word " * 200).ids[:48 - len(tail) - (longer - 1)] + tail


def test_a_count_past_the_scored_pool_stops_the_prepare_naming_the_setting(tmp_path):
    """The thresholds step of `kiln prepare` raised a bare ValueError (a datatrove traceback
    on the console); it is a RunDataError naming prepare.perplexity.count, as the Brain Rot
    arms' budget is."""
    from kiln.data.filters.selection import PerplexityThresholds
    from kiln.errors import RunDataError

    step = PerplexityThresholds("top_fraction", 0.0, 0.0, 0.0, tmp_path / "t.json", count=5)
    docs = [Document(text=str(i), id=str(i), metadata={"ppl": float(i)}) for i in range(3)]
    with pytest.raises(RunDataError, match=r"prepare\.perplexity\.count: count 5 is more than "
                                           r"the 3 scored documents"):
        list(step.run(iter(docs)))
    assert not (tmp_path / "t.json").exists()
    step = PerplexityThresholds("top_fraction", 0.0, 0.0, 0.0, tmp_path / "t.json", count=3)
    list(step.run(iter(docs)))
    assert json.loads((tmp_path / "t.json").read_text())["threshold"] == 0.0


def _far_from_init(doc_mask: bool):
    """A small model whose random weights sit far from init, so a key it should not see moves
    the logits well past rounding."""
    from kiln.config import ModelConfig
    from kiln.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    max_seq_len=32, doc_mask=doc_mask))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("doc_mask", [True, False])
def test_a_doc_masked_scorer_scores_documents_as_training_saw_them(doc_mask):
    """With `model.doc_mask`, training predicted a document's first token from the EOS before
    it and its other tokens from the document alone (an EOS belongs to the document it ends).
    The perplexity scorer feeds [EOS] + document: each row's NLL must equal that reference,
    whatever the other rows (right-padding with id 0, the EOS); without the mask, the plain
    causal forward over [EOS] + document."""
    eos = 0
    model = _far_from_init(doc_mask)
    docs = [[5, 9, 2, 7, 7, 3], [11, 4], [8, 8, 8, 1, 30, 2, 6, 5, 12]]
    with torch.no_grad():
        expected = []
        for d in docs:
            first = F.log_softmax(model(torch.tensor([[eos]]))[0, -1].double(), -1)[d[0]]
            if doc_mask:  # the rest from the document alone
                rest = F.log_softmax(model(torch.tensor([d[:-1]]))[0].double(), -1)
            else:
                rest = F.log_softmax(model(torch.tensor([[eos, *d[:-1]]]))[0, 1:].double(), -1)
            nll = -first - rest.gather(1, torch.tensor(d[1:])[:, None]).sum()
            expected.append(float(nll))
        got = continuation_nll(model, [[eos]] * len(docs), docs, eos_id=eos)
    assert [n for _, n in got] == [len(d) for d in docs]
    assert [nats for nats, _ in got] == pytest.approx(expected, rel=1e-5, abs=1e-5)
    if doc_mask:  # the unmasked forward (the EOS seen by every token) is far from it
        unmasked = continuation_nll(model, [[eos]] * len(docs), docs)
        assert max(abs(a - b) for (a, _), b in zip(unmasked, expected)) > 1e-2


def test_a_score_from_an_earlier_checkpoint_of_the_judges_run_is_judged_again(run_dir, tmp_path):
    """The Kiln judge's identity was its run directory and template alone: documents carrying
    a score from checkpoint 5 kept it after the run trained on to checkpoint 10, though the
    judge was now another model. A carried score must be redone as a fresh document's is."""
    import shutil

    from kiln.data.filters import SemanticQualityFilter

    run = tmp_path / "run"
    shutil.copytree(run_dir[0], run)
    carried = Document(text="the cat sat", id="carried")
    SemanticQualityFilter(KilnLabelJudge(run, template="post: {text} ->"), mode="tag").filter(carried)
    torch.manual_seed(1)  # other weights than the fixture's seed 0
    model = Transformer(load_config(run / "config.toml", recorded=True).model)
    save_checkpoint(run / "checkpoints", 10, model, torch.optim.SGD(model.parameters(), lr=0.1),
                    {"step": 10}, DistEnv())
    later = SemanticQualityFilter(KilnLabelJudge(run, template="post: {text} ->"), mode="tag")
    fresh = Document(text="the cat sat", id="fresh")
    later.filter(fresh)
    later.filter(carried)
    assert carried.metadata["m2_reasons"] == fresh.metadata["m2_reasons"]
    assert carried.metadata["m2_judge"] == fresh.metadata["m2_judge"]


def test_the_parts_of_a_cut_text_take_its_first_parts_score(run_dir):
    """The reader cuts a text over 1,000,000 characters into parts (`part_of`). Each part was
    scored on its own start, so selection kept some parts of a book and dropped others; the
    paper scores a document by its first 512 tokens: every part takes its text's score."""
    from kiln.data.long_documents import PART_OF

    run, model, tok = run_dir
    texts = [DOCS[0], DOCS[2], DOCS[3]]  # three parts of one text, unlike each other
    parts = [Document(text=t, id=f"book#{i + 1}", metadata={PART_OF: "book"})
             for i, t in enumerate(texts)]
    other = Document(text=DOCS[1], id="other")
    after = Document(text=DOCS[2], id="next#1", metadata={PART_OF: "next"})
    list(PerplexityScorer(run, batch_size=2).run(iter([*parts, other, after])))
    first = direct_ppl(model, tok, texts[0], 47)[0]
    assert [d.metadata["ppl"] for d in parts] == pytest.approx([first] * 3, rel=1e-5)
    assert other.metadata["ppl"] == pytest.approx(direct_ppl(model, tok, DOCS[1], 47)[0], rel=1e-5)
    assert after.metadata["ppl"] == pytest.approx(direct_ppl(model, tok, DOCS[2], 47)[0], rel=1e-5)
    keep = PerplexitySelector("top_fraction", fraction=0.5,
                              scores=scores_from([*parts, other, after]))
    assert len({get_filter_result(keep.filter(d)) for d in parts}) == 1  # all kept or all not


def test_a_judge_made_before_its_run_wrote_a_checkpoint_refuses_the_new_weights(run_dir, tmp_path):
    """The judge's identity (its checkpoint) is taken when the pipeline is built; the weights
    are loaded later, in a task. A checkpoint written in between (the judge's run still
    training) was loaded and its scores stored under the older checkpoint's identity, so a
    later prepare with that older checkpoint's judge would reuse another model's scores."""
    import shutil

    from kiln.errors import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(run_dir[0], run)
    judge = KilnLabelJudge(run, template="post: {text} ->")  # built: checkpoint 5, not loaded
    before = judge.identity
    torch.manual_seed(1)
    model = Transformer(load_config(run / "config.toml", recorded=True).model)
    save_checkpoint(run / "checkpoints", 10, model, torch.optim.SGD(model.parameters(), lr=0.1),
                    {"step": 10}, DistEnv())
    with pytest.raises(CheckpointError, match="trained on since the pipeline was built"):
        judge.judge("the cat sat")
    assert judge.identity == before
    assert KilnLabelJudge(run, template="post: {text} ->").judge("the cat sat").reasons  # anew


def test_a_scorer_made_before_its_run_wrote_a_checkpoint_refuses_the_new_weights(run_dir, tmp_path):
    """Each task loaded whatever checkpoint was latest then: a scoring run still training
    during the prepare had tasks score with other weights, and the selection's thresholds
    mixed two models' perplexities. The scorer keeps the checkpoint it was made with."""
    import shutil

    from kiln.errors import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(run_dir[0], run)
    scorer = PerplexityScorer(run)  # built: the latest checkpoint taken, not loaded
    torch.manual_seed(1)
    model = Transformer(load_config(run / "config.toml", recorded=True).model)
    save_checkpoint(run / "checkpoints", 10, model, torch.optim.SGD(model.parameters(), lr=0.1),
                    {"step": 10}, DistEnv())
    docs = [Document(text="the cat sat on the mat", id="a")]
    with pytest.raises(CheckpointError, match="perplexity scorer .* trained on since the pipeline"):
        scorer.score(docs)
    PerplexityScorer(run).score(docs)  # made anew: the new checkpoint's
    assert docs[0].metadata["ppl"] > 0


@pytest.mark.parametrize(("mode", "options", "message"), [
    ("top_fraction", {"fraction": 0.01}, r"prepare\.perplexity\.fraction: 0\.01 of the 50 scored "
                                         r"documents keeps none .*at least 1/50"),
    ("bottom_fraction", {"fraction": 0.01}, r"prepare\.perplexity\.fraction: 0\.01 of the 50"),
    ("drop_extremes", {"low_q": 0.49, "high_q": 0.51}, r"prepare\.perplexity\.low_q / high_q: the "
                                                     r"band .* holds none of the 50 scored"),
])
def test_a_selection_that_keeps_nothing_stops_after_scoring_naming_the_setting(tmp_path, mode,
                                                                              options, message):
    """A fraction whose floor is 0 documents (0.01 of 50), or a quantile band between two
    scores, kept nothing: the prepare went on through every later stage and ended in "no
    documents", naming no setting. It stops at the thresholds, naming it."""
    from kiln.data.filters.selection import PerplexityThresholds
    from kiln.errors import RunDataError

    spread = [1.0] * 25 + [100.0] * 25  # a band strictly between the two values holds none
    docs = [Document(text=str(i), id=str(i), metadata={"ppl": s}) for i, s in enumerate(spread)]
    how = {"fraction": 0.0, "low_q": 0.0, "high_q": 0.0, **options}
    step = PerplexityThresholds(mode, how["fraction"], how["low_q"], how["high_q"],
                                tmp_path / "t.json")
    with pytest.raises(RunDataError, match=message):
        list(step.run(iter(docs)))
    assert not (tmp_path / "t.json").exists()
    step = PerplexityThresholds(mode, 0.02, 0.0, 0.5, tmp_path / "t.json")  # one is kept
    list(step.run(iter(docs)))
    assert (tmp_path / "t.json").is_file()


def _tricky_texts():
    import random

    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "park", "dawn", "é", "😀", "今天", "42", "x1",
             "  ", "\n\n", "\t", "don't", "...", "zq"]
    yield from DOCS
    for n in (1, 10, 100, 1000, 20000):
        yield "".join(rng.choice(words) + rng.choice(["", " ", " ", "\n"]) for _ in range(n))
    yield "a" * 30000  # one pre-tokenizer piece: no prefix is settled, the whole is encoded
    yield "word " * 5000 + "z" * 5000
    yield " " * 3000 + "the cat"  # a whitespace run the lookahead splits
    yield "今天天气很好" * 2000
    yield "1234567890" * 3000


@pytest.mark.parametrize("limit", [1, 5, 48, 512])
def test_first_tokens_of_a_prefix_are_the_whole_texts_first_tokens(run_dir, limit):
    """The scorer encodes a prefix of each text, not the whole (up to 1 MB): the ids are
    exactly the whole encoding's first `limit`, on texts whose cut is awkward."""
    from kiln.data.filters.first_tokens import first_token_ids

    _, _, tok = run_dir
    texts = list(_tricky_texts())
    want = [e.ids[:limit] for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert first_token_ids(tok, texts, limit) == want


class _SeenTexts:
    """The run's tokenizer, noting the length of every text it is given."""

    def __init__(self, tok):
        self.tok, self.lengths = tok, []

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode_batch(self, texts, **kw):
        self.lengths += [len(t) for t in texts]
        return self.tok.encode_batch(texts, **kw)

    def encode(self, text, **kw):
        self.lengths.append(len(text))
        return self.tok.encode(text, **kw)


def test_a_long_document_is_scored_from_its_start_without_tokenizing_all_of_it(run_dir):
    """A 1,000,000-character document was tokenized whole to score its first tokens: now a
    few thousand characters are, and its score is the one of the whole text's first tokens."""
    run, model, tok = run_dir
    long = " ".join(DOCS) * 33_000  # ~1 MB
    docs = [Document(text=long[:1_000_000], id="long"), Document(text=DOCS[0], id="short")]
    scorer = PerplexityScorer(run, batch_size=2)
    m, t, eos, limit = scorer._load()
    seen = _SeenTexts(t)
    scorer._loaded = (m, seen, eos, limit)
    list(scorer.run(iter(docs)))
    for doc in docs:
        ppl, n = direct_ppl(model, tok, doc.text, limit=48)
        assert doc.metadata["ppl"] == pytest.approx(ppl, rel=1e-5) and doc.metadata["ppl_tokens"] == n
    assert max(seen.lengths) <= 8 * 48


def test_the_judge_reads_a_long_posts_start_without_tokenizing_all_of_it(run_dir):
    """The M2 judge cut its prompt to the model's context after tokenizing the whole post."""
    run, _, tok = run_dir
    judge = KilnLabelJudge(run, template="post: {text} ->")
    model, real, *parts = judge._load()
    seen = _SeenTexts(real)
    judge._loaded = (model, seen, *parts)
    post = "word " * 200_000
    tail = tok.encode(" ->").ids
    room = 48 - len(tail) - (len(tok.encode(" HIGH-QUALITY").ids) - 1)
    assert judge.prompt_ids(post) == tok.encode("post: " + post).ids[:room] + tail
    assert max(seen.lengths) <= 8 * 48
