"""FSDP2 over 2 gloo ranks resumes exactly: a run stopped right after its step-6 checkpoint
and resumed gives the losses of the run straight through, on 2 ranks (bitwise) and on one
process (the model is sharded from where it was made, not moved whole first: its
checkpoint must read back as it did)."""

from __future__ import annotations

import shutil

import pytest
from conftest import tiny_config
from mp_helpers import run_function_on_ranks

from kiln.report import read_metrics
from kiln.train.trainer import Trainer


def _train_losses(rank: int, world_size: int, run_dir, stop_at: int | None) -> list[float]:
    from kiln.train.callbacks import Callback, default_callbacks

    class StopAt(Callback):
        def on_step_end(self, t, record):
            if t.step == stop_at:
                raise KeyboardInterrupt

    trainer = Trainer(tiny_config(run_dir, "train.parallel=fsdp"),
                      callbacks=[*default_callbacks(), StopAt()])
    try:
        return trainer.fit()
    except KeyboardInterrupt:
        return []


def _losses(run_dir) -> list[float]:
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    return [r["loss"] for r in recs]


def test_fsdp_two_ranks_resume_as_they_ran_straight(tiny_run, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(tiny_run, stopped)
    run_function_on_ranks(_train_losses, 2, args=(tiny_run, None), timeout=300)
    straight = _losses(tiny_run)
    run_function_on_ranks(_train_losses, 2, args=(stopped, 6), timeout=300)
    assert len(_losses(stopped)) == 6  # stopped there: the rest is the resumed run's
    on_one = tmp_path / "on_one"
    shutil.copytree(stopped, on_one)
    run_function_on_ranks(_train_losses, 2, args=(stopped, None), timeout=300)
    assert len(straight) == 12
    assert _losses(stopped)[-6:] == straight[6:]  # bitwise: the same floats
    Trainer(tiny_config(on_one)).fit()  # the 2-rank checkpoint resumed by one process
    assert len(_losses(on_one)) == 12
    for a, b in zip(_losses(on_one)[-6:], straight[6:], strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def _resumed_optimizer(rank: int, world_size: int, run_dir,
                       settings: tuple[str, ...]) -> tuple[list[str], bool | None]:
    """A 2-rank resume (`settings`: its parallel mode and optimizer): the files this rank
    read with torch.load, and (rank 0) whether the optimizer state the ranks hold, gathered
    whole, is the checkpoint's, bitwise."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from kiln.train.checkpoint_weights import FULL_ON_CPU

    read, loaded = [], torch.load

    def load(f, *args, **kwargs):
        read.append(getattr(f, "name", str(f)))
        return loaded(f, *args, **kwargs)

    torch.load = load
    trainer = Trainer(tiny_config(run_dir, *settings))
    torch.load = loaded
    held = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=FULL_ON_CPU)
    if rank != 0:
        return read, None
    saved = torch.load(trainer._resumed_from / "optimizer.pt", weights_only=True)

    def same(a, b) -> bool:
        if torch.is_tensor(a):
            return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    return read, same(saved["state"], held["state"])


@pytest.mark.parametrize("settings", [
    ("train.parallel=fsdp",), ("train.parallel=ddp",),
    ("train.parallel=fsdp", "optim.name=muon"), ("train.parallel=ddp", "optim.name=muon")],
    ids=["fsdp", "ddp", "fsdp-muon", "ddp-muon"])
def test_a_resume_reads_the_optimizer_state_on_rank_zero_alone(tiny_run, settings):
    """Every rank read the whole optimizer.pt (two fp32 moments per weight) before keeping
    its shard: a node's host memory held it once per rank (a 25M-parameter model: +400 MiB
    per rank in the load, +158 MiB on rank 1 now). Rank 0 reads it and sends each rank its
    part; the state the ranks hold is the checkpoint's, bitwise (here one process's
    checkpoint resumed by 2 ranks)."""
    Trainer(tiny_config(tiny_run, *settings, "train.steps=3", "train.checkpoint_every=3")).fit()
    (read0, same), (read1, _) = run_function_on_ranks(_resumed_optimizer, 2,
                                                      args=(tiny_run, settings), timeout=300)
    assert "optimizer.pt" in read0 and same is True
    assert "optimizer.pt" not in read1 and "trainer.pt" in read1
