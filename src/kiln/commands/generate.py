"""`kiln generate`: samples from the latest checkpoint, one seeded generator per prompt; and
the prompt check `kiln run` makes before training (a prompt too long for the model's
context is refused)."""

from __future__ import annotations

import sys

from kiln.config import Config, ConfigError


def _prompt_seed(seed: int, prompt: str, repeat: int) -> int:
    """The seed of a prompt's generator: from the run's seed, the prompt's text and how many
    identical prompts came before it (a repeated prompt draws another sample)."""
    import hashlib

    key = f"{seed}\0{repeat}\0{prompt}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def _prompt_ids(tok, prompt: str, max_len: int) -> list[int]:
    """The ids `prompt` starts from, refused when they leave no room in the model's context
    (`max_len`) for a new token."""
    from kiln.data.tokenizer import eos_id

    # "" samples a document from its start: the EOS that ends the one before is the context.
    # No template's BOS/EOS (a tokenizer.json brought in may have one): the shards have none
    ids = tok.encode(prompt, add_special_tokens=False).ids if prompt else [eos_id(tok)]
    if len(ids) >= max_len:
        shown = repr(prompt[:40]) + ("..." if len(prompt) > 40 else "")
        raise ConfigError(f"generate.prompts: {shown} is {len(ids)} tokens, which leaves no "
                          f"room in the model's context (model.max_seq_len = {max_len}): "
                          "shorten it")
    return ids


def _as_the_console_shows(text: str) -> str:
    """`text` with each character stdout's encoding lacks (an ASCII or Latin-1 locale, a
    redirect on Windows' cp1252) as its backslash escape: printed as it was, one such
    character (a U+FFFD the model wrote) stopped `kiln generate` with a traceback before
    samples.json was written. samples.json keeps the text itself."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def refuse_prompts_that_do_not_fit(cfg: Config) -> None:
    """`kiln run` asks, once the tokenizer is made, what `kiln generate` would refuse after
    training (and before the export that follows it)."""
    from kiln.data.provenance import tokenizer_path
    from kiln.data.tokenizer import load_tokenizer

    if not tokenizer_path(cfg.run_dir).is_file():  # no data stages ran: generate says what to run
        return
    tok = load_tokenizer(tokenizer_path(cfg.run_dir))
    for prompt in cfg.generate.prompts:
        _prompt_ids(tok, prompt, cfg.model.max_seq_len)


def cmd_generate(cfg: Config) -> None:
    import torch

    from kiln.atomic import write_json_atomic
    from kiln.data.provenance import run_tokenizer
    from kiln.data.sample_text import decode_sample
    from kiln.data.tokenizer import eos_id
    from kiln.model.sampling import decoding_settings, generate
    from kiln.train.precision import resolve_device
    from kiln.train.trained_run import load_trained_model

    model, ckpt = load_trained_model(cfg)
    model.to(resolve_device(cfg.train.device))
    tok = run_tokenizer(cfg.run_dir)
    g = cfg.generate
    samples = []
    max_len = model.cfg.max_seq_len
    seen: dict[str, int] = {}
    # every prompt checked before any is sampled: a long one last would waste the others' time
    prompt_ids = [_prompt_ids(tok, prompt, max_len) for prompt in g.prompts]
    for prompt, ids in zip(g.prompts, prompt_ids, strict=True):
        # one generator per prompt, seeded from its text: its sample depends neither on the
        # other prompts nor on its place in the list; on CPU, so samples match across devices
        repeat = seen[prompt] = seen.get(prompt, -1) + 1
        rng = torch.Generator().manual_seed(_prompt_seed(cfg.run.seed, prompt, repeat))
        if len(ids) + g.max_new_tokens > max_len:
            print(f"note: {prompt[:40]!r}: at most {max_len - len(ids)} new tokens fit the "
                  f"model's context of {max_len} (generate.max_new_tokens = {g.max_new_tokens})",
                  file=sys.stderr)
        out = generate(model, ids, g.max_new_tokens, temperature=g.temperature, top_k=g.top_k,
                       top_p=g.top_p, eos_id=eos_id(tok), generator=rng,
                       vocab_size=tok.get_vocab_size())
        # the sample's complete characters: a stop can cut the last one short
        completion, cut = decode_sample(tok, out, eos_id(tok))
        sample = {"prompt": prompt, "completion": completion}
        if cut:
            sample["incomplete_bytes_dropped"] = cut
        samples.append({**sample, **decoding_settings(g.temperature, g.top_k, g.top_p),
                        "checkpoint": ckpt.name})
        heading = f"--- {prompt!r}{'' if prompt else ' (a document from its start)'}"
        print(_as_the_console_shows(f"{heading}\n{prompt}{completion}"))
        if cut:
            print(f"note: {prompt[:40]!r}: the sample stopped inside a character; its last "
                  f"{cut} byte{'s' if cut > 1 else ''} (an incomplete UTF-8 character) "
                  f"{'are' if cut > 1 else 'is'} left out", file=sys.stderr)
    write_json_atomic(cfg.run_dir / "samples.json", samples)
