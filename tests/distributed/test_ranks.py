"""1 rank vs 2 gloo ranks: the same global batch gives the same losses (DDP and FSDP2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import tiny_config
from launch import free_port, run_ranks

from kiln.report import read_metrics
from kiln.train.trainer import Trainer


def losses(run_dir) -> list[float]:
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    return [r["loss"] for r in sorted(recs, key=lambda r: r["step"])]


@pytest.fixture
def single_rank_losses(tiny_run, tmp_path):
    ref = tmp_path / "single"
    shutil.copytree(tiny_run, ref)
    Trainer(tiny_config(ref)).fit()
    return losses(ref)


# micro_batch 2: each rank accumulates two micro-batches, with the gradient sync skipped on
# the first (DDP no_sync, FSDP2 set_requires_gradient_sync)
@pytest.mark.parametrize("mode, micro", [("ddp", 4), ("fsdp", 4), ("ddp", 2), ("fsdp", 2)])
def test_two_ranks_match_one_rank(tiny_run, single_rank_losses, mode, micro):
    run_ranks(["train", str(tiny_run), "--set", f"train.parallel={mode}", "--set",
               f"train.micro_batch={micro}"], world_size=2, timeout=300)
    two = losses(tiny_run)
    assert len(two) == len(single_rank_losses) == 12
    for a, b in zip(two, single_rank_losses):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    model = (tiny_run / "model.json").read_text()
    assert '"world_size": 2' in model


def test_torchrun_two_processes(tiny_run):
    """The documented launcher works on CPU: `torchrun --nproc_per_node=2 -m kiln.cli train`."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "kiln.cli",
           "train", str(tiny_run), "--set", "train.steps=4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(losses(tiny_run)) == 4


def test_torchrun_one_process_is_wrapped_like_more(tiny_run, tmp_path):
    """`torchrun --nproc_per_node=1` joins a process group and wraps the model (FSDP2 here),
    so one GPU checks the path many use; it trains as a plain process does."""
    import json

    ref = tmp_path / "plain"
    shutil.copytree(tiny_run, ref)
    Trainer(tiny_config(ref, "train.steps=4")).fit()
    assert json.loads((ref / "model.json").read_text())["parallel"] == "none"
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc_per_node=1", f"--master_port={free_port()}", "-m", "kiln.cli",
           "train", str(tiny_run), "--set", "train.steps=4", "--set", "train.parallel=fsdp"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((tiny_run / "model.json").read_text())["parallel"] == "fsdp"
    for a, b in zip(losses(tiny_run), losses(ref), strict=True):
        assert a == pytest.approx(b, rel=1e-5)


# bf16 is forced to test its path; on CPUs without native bf16 the Trainer warns, as it should
@pytest.mark.filterwarnings("ignore:precision = 'bf16' on a CPU without")
def test_bf16_two_ranks_match_one_rank(tiny_run, tmp_path):
    """bf16 autocast (matmul attention, fused loss, bf16 norm outputs) under FSDP2 on 2 ranks
    follows the single-process run to bf16 precision, and trains."""
    bf16 = "train.precision=bf16"
    ref = tmp_path / "single"
    shutil.copytree(tiny_run, ref)
    Trainer(tiny_config(ref, bf16)).fit()
    run_ranks(["train", str(tiny_run), "--set", "train.parallel=fsdp", "--set", bf16],
              world_size=2, timeout=300)
    one, two = losses(ref), losses(tiny_run)
    assert len(one) == len(two) == 12
    assert two[0] == pytest.approx(one[0], rel=1e-3)  # same weights, same micro-batches
    for a, b in zip(two, one):
        assert a == pytest.approx(b, rel=3e-2)
    assert sum(two[-3:]) < sum(two[:3])


def test_eval_on_two_ranks_matches_one(tiny_run):
    """`kiln eval` under torchrun: the ranks share the windows, rank 0 alone reports."""
    import json

    Trainer(tiny_config(tiny_run, "train.steps=4")).fit()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "kiln.cli", "eval", str(tiny_run)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    single = json.loads((tiny_run / "eval.json").read_text())
    out = run_ranks(["eval", str(tiny_run)], world_size=2)
    assert out.count("bits/byte") == 1  # printed once, by rank 0
    two = json.loads((tiny_run / "eval.json").read_text())
    assert (single["ranks"], two["ranks"]) == (1, 2)  # the windows were shared
    assert two["tokens"] == single["tokens"] > 0
    assert two["bpb"] == pytest.approx(single["bpb"], rel=1e-6)


def _resume_on_own_dir(rank: int, world_size: int, dirs: list) -> str:
    from kiln.errors import CheckpointError

    try:
        Trainer(tiny_config(dirs[rank], "train.parallel=ddp"))
    except CheckpointError as e:
        return str(e)
    return "resumed"


def test_ranks_resuming_from_different_checkpoints_is_refused(tiny_run, tmp_path):
    """Two nodes without a shared run directory: one finds a checkpoint, the other none. Both
    ranks refuse, naming what each found, instead of hanging in a collective or training
    from two states."""
    from mp_helpers import run_function_on_ranks

    other = tmp_path / "node1"
    shutil.copytree(tiny_run, other)
    Trainer(tiny_config(tiny_run, "train.steps=6")).fit()
    said = run_function_on_ranks(_resume_on_own_dir, 2, args=([tiny_run, other],), timeout=120)
    for msg in said:
        assert "different checkpoints" in msg and "no checkpoint to step 6" in msg
    assert "rank 1: no checkpoint" in said[1] and "rank 0: step 6" in said[0]
    # the same folder on both ranks resumes
    same = run_function_on_ranks(_resume_on_own_dir, 2, args=([tiny_run, tiny_run],), timeout=120)
    assert same == ["resumed", "resumed"]
