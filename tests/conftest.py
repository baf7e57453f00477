"""Shared fixtures: one tiny prepared corpus (documents, tokenizer, shards) per session."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kiln.cli import cmd_prepare, cmd_tokenize, cmd_tokenizer  # noqa: E402
from kiln.config import Config, load_config  # noqa: E402
from kiln.run_dir import write_run_metadata  # noqa: E402

TINY = [
    "data.max_bytes=400000", "tokenizer.vocab_size=512", "model.dim=64", "model.n_layers=2",
    "model.n_heads=4", "model.n_kv_heads=2", "model.max_seq_len=64", "train.seq_len=32",
    "train.global_batch=8", "train.micro_batch=4", "train.steps=12", "train.log_every=1",
    "train.eval_every=6", "train.eval_batches=4", "train.checkpoint_every=6",
    "train.precision=fp32", "schedule.warmup_steps=3", "data.val_fraction=0.05",
    "generate.max_new_tokens=8", "eval.max_batches=8",
]


def as_written(ckpt: Path) -> None:
    """Record checkpoint `ckpt`'s files as they are now (its checksums.json made again): a
    test that builds a bad checkpoint on purpose (non-finite weights, an altered trainer
    state, an older Kiln's damaged pickle) reaches the check after the checksum one."""
    import json

    from kiln.hashing import file_sha256
    from kiln.train.checkpoint import CHECKSUMS

    sums = json.loads((ckpt / CHECKSUMS).read_text())
    (ckpt / CHECKSUMS).write_text(json.dumps({name: file_sha256(ckpt / name) for name in sums}))


def as_before_checksums(ckpt: Path) -> None:
    """Make checkpoint `ckpt` as a Kiln from before checksums wrote it: no checksums.json,
    and no "format" in its trainer.pt (a checkpoint marked so that lacks the file is refused)."""
    import torch

    from kiln.train.checkpoint import CHECKSUMS

    (ckpt / CHECKSUMS).unlink()
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    state.pop("format")
    torch.save(state, ckpt / "trainer.pt")


def tiny_config(run_dir: Path, *extra: str) -> Config:
    return load_config(None, [*TINY, f'run.dir="{run_dir}"', *extra])


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """A run directory with documents, tokenizer and token shards, built once."""
    run_dir = tmp_path_factory.mktemp("prepared")
    cfg = tiny_config(run_dir)
    write_run_metadata(cfg)
    for step in (cmd_prepare, cmd_tokenizer, cmd_tokenize):
        step(cfg)
    return run_dir


@pytest.fixture
def tiny_run(prepared_data, tmp_path) -> Path:
    """A fresh copy of the prepared run directory, ready for `kiln train`."""
    run_dir = tmp_path / "run"
    shutil.copytree(prepared_data, run_dir)
    return run_dir


def gpt2_byte_symbols() -> dict[str, int]:
    """GPT-2's byte -> printable character map (the one byte-level BPE writes tokens in),
    written out here as the reference, inverted: symbol -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def sighup_would_end_the_process(signum, frame):
    raise AssertionError("SIGHUP met Python's default: it ends the process at once")


@pytest.fixture
def signals_as_in_a_terminal():
    """What a shell in a terminal gives a foreground command (a suite started under `nohup`
    or in the background inherits SIGINT ignored, which Kiln leaves ignored), but for
    SIGHUP's default, which would end the whole suite: a handler that fails the test in its
    stead. For the tests of Kiln's stop signals (`pytestmark = usefixtures(...)`)."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(s) for s in sigs]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, sighup_would_end_the_process)
    yield
    for sig, handler in zip(sigs, before):
        signal.signal(sig, handler)
