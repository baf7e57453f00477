"""1 rank vs 2 gloo ranks: the same global batch gives the same losses (DDP and FSDP2)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
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


def rank_adamw(monkeypatch) -> None:
    """Build this process's AdamW without the fused kernel: FSDP2's DTensor shards take
    torch's per-tensor AdamW, which rounds ~6% of the elements of an update one fp32 ulp
    away from the fused kernel's (measured on CPU, torch 2.13)."""
    import kiln.train.trainer as trainer_mod

    built = trainer_mod.build_optimizer

    def unfused(model, cfg):
        optimizer = built(model, cfg)
        for group in optimizer.param_groups:
            group["fused"] = False
        return optimizer

    monkeypatch.setattr(trainer_mod, "build_optimizer", unfused)


def bf16_one_and_two_ranks(tiny_run, tmp_path, *extra: str) -> tuple[list[dict], list[dict]]:
    """The train records of one process and of 2 FSDP2 ranks, bf16, same settings."""
    settings = ["train.precision=bf16", *extra]
    ref = tmp_path / "single"
    shutil.copytree(tiny_run, ref)
    Trainer(tiny_config(ref, *settings)).fit()
    run_ranks(["train", str(tiny_run), "--set", "train.parallel=fsdp",
               *(a for s in settings for a in ("--set", s))], world_size=2, timeout=300)
    assert '"precision": "bf16"' in (tiny_run / "model.json").read_text()
    return [[r for r in read_metrics(d / "metrics.jsonl") if r["kind"] == "train"]
            for d in (ref, tiny_run)]


# bf16 is forced to test its path; on CPUs without native bf16 the Trainer warns, as it should
@pytest.mark.filterwarnings("ignore:precision = 'bf16' on a CPU without")
def test_bf16_two_ranks_equal_one_rank_with_the_same_optimizer_kernel(tiny_run, tmp_path,
                                                                       monkeypatch):
    """bf16 autocast (matmul attention, fused loss, bf16 norm outputs) under FSDP2: the
    ranks' gradients equal one process's to the bit (each rank's micro-batch is one of the
    process's two; the mean of two is exact), so with the same AdamW and no clipping (whose
    norm the shards sum in another order) every loss is the same float."""
    rank_adamw(monkeypatch)
    one, two = bf16_one_and_two_ranks(tiny_run, tmp_path, "optim.grad_clip=0")
    assert len(one) == len(two) == 12
    assert [r["loss"] for r in two] == [r["loss"] for r in one]
    for a, b in zip(two, one):  # the same gradients, their norm summed shard by shard
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)  # measured <= 1.4e-6


@pytest.mark.filterwarnings("ignore:precision = 'bf16' on a CPU without")
def test_bf16_two_ranks_follow_one_rank(tiny_run, tmp_path):
    """As trained (clipping on, the fused AdamW in one process): the first step's loss is
    the same float, and the rest follow within 2e-4. Measured 1.3e-5 (2.4e-7 at step 5,
    the first to differ); up to 4.7e-5 over 24 steps or another clip or micro-batch. Why they
    differ at all: weights one fp32 ulp apart (the optimizer kernel, the clip coefficient
    from the sharded norm) cast to different bf16 values where they sit at a rounding
    midpoint, so bf16 shows what fp32 absorbs. (One process in fp32 is 5e-5 from bf16:
    no tolerance here tells them apart; the test above and the first step do.)"""
    one, two = (
        [r["loss"] for r in recs] for recs in bf16_one_and_two_ranks(tiny_run, tmp_path))
    assert len(one) == len(two) == 12
    assert two[0] == one[0]  # same weights, same micro-batches
    for a, b in zip(two, one):
        assert a == pytest.approx(b, rel=2e-4)
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
    single_windows = np.load(tiny_run / "eval_windows.npy")
    out = run_ranks(["eval", str(tiny_run)], world_size=2)
    assert out.count("bits/byte") == 1  # printed once, by rank 0
    two = json.loads((tiny_run / "eval.json").read_text())
    assert (single["ranks"], two["ranks"]) == (1, 2)  # the windows were shared
    assert two["tokens"] == single["tokens"] > 0
    assert two["bpb"] == pytest.approx(single["bpb"], rel=1e-6)
    # next-token concentration: sums over the ranks' positions, not a mean of rank means
    assert set(two["next_token"]) == set(single["next_token"])
    for key, value in single["next_token"].items():
        assert two["next_token"][key] == pytest.approx(value, rel=1e-6), key
    assert out.count("next-token concentration") == 1
    # every window's loss, in the split's order, whichever rank scored it
    assert two["window_losses"]["count"] == single["window_losses"]["count"] > 1
    assert np.load(tiny_run / "eval_windows.npy") == pytest.approx(single_windows, rel=1e-6)
    # gathered by rank 0 from each rank's own windows: the very bytes one process writes
    assert two["window_losses"]["sha256"] == single["window_losses"]["sha256"]


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


def _start_with(rank: int, world_size: int, tiny_run, per_rank: list) -> str:
    from kiln.config import ConfigError

    try:
        Trainer(tiny_config(tiny_run, "train.parallel=ddp", *per_rank[rank]))
    except ConfigError as e:
        return str(e)
    return "started"


def test_ranks_started_with_different_settings_are_refused(tiny_run):
    """Per-node recipes or a hand launch that disagree (an lr, the seed, DDP on one rank and
    FSDP on the other) would train drifting replicas, read other data, or hang: every rank
    refuses at start, naming the keys and each rank's value."""
    from mp_helpers import run_function_on_ranks

    said = run_function_on_ranks(_start_with, 2, timeout=120, args=(
        tiny_run, [["optim.lr=0.003"], ["optim.lr=0.03", "train.parallel=fsdp"]]))
    for msg in said:
        assert "the ranks were started with different settings" in msg
        assert "optim.lr: rank 0 0.003, rank 1 0.03" in msg
        assert "train.parallel: rank 0 'ddp', rank 1 'fsdp'" in msg
    same = run_function_on_ranks(_start_with, 2, timeout=120, args=(tiny_run, [[], []]))
    assert same == ["started", "started"]


def _no_core_file() -> None:
    """The SIGABRT a hung rank is sent (for its stacks) leaves no core file behind."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("killed", [1, 0], ids=["rank 1", "rank 0 (the store's host)"])
def test_a_killed_rank_stops_the_other_with_one_line(tiny_run, killed):
    """kill -9 of one rank mid-training: the surviving rank's collective fails; it says so in
    one line with the resume advice, not a gloo traceback, and the checkpoints stay. Rank 0
    of a hand launch holds the store: rank 1, reading the store for a rank's word that it
    stopped, printed ~25 lines of C++ frames (`TCPStore recvValue failed`) first."""
    import tempfile
    import time

    from kiln.train.checkpoint_dirs import latest_checkpoint

    port, procs, logs = free_port(), [], []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "PYTHONFAULTHANDLER": "1"}  # a SIGABRT below prints where a rank hangs
        logs.append(tempfile.TemporaryFile())
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "kiln.cli", "train", str(tiny_run), "--set", "train.steps=2000",
             "--set", "train.checkpoint_every=2", "--set", "train.parallel=ddp"],
            env=env, stdout=logs[-1], stderr=subprocess.STDOUT, preexec_fn=_no_core_file))
    try:
        deadline = time.monotonic() + 240
        while latest_checkpoint(tiny_run / "checkpoints") is None:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.1)
        procs[killed].kill()
        procs[killed].wait()
        try:
            code = procs[1 - killed].wait(timeout=120)
        except subprocess.TimeoutExpired:  # said below with the rank's output and stacks
            code = None
            procs[1 - killed].send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[1 - killed].wait(timeout=20)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs[1 - killed].seek(0)
    out = logs[1 - killed].read().decode(errors="replace")
    assert code == 1, f"rank {1 - killed} exited {code} (None: still running 120 s after " \
        f"rank {killed} was killed):\n{out[-12000:]}"
    assert "kiln: train stopped: another rank of this launch failed or was killed" in out
    assert f"`kiln train {tiny_run}` resumes from the latest" in out
    for noise in ("Traceback", "TCPStore", "frame #"):
        assert noise not in out, out
    assert latest_checkpoint(tiny_run / "checkpoints") is not None


def test_verbs_with_nothing_to_share_run_on_rank_zero_alone(tiny_run):
    """generate / export / report (and the data verbs) under torchrun: rank 0 does the work
    once, the others exit, instead of every rank writing the same files at once."""
    Trainer(tiny_config(tiny_run, "train.steps=2", "train.checkpoint_every=2")).fit()
    for verb in ("generate", "report"):
        outs = run_ranks([verb, str(tiny_run)], world_size=2, every_rank=True)
        assert f"`kiln {verb}` runs on rank 0 alone" in outs[0]
        assert outs[1].strip() == ""  # rank 1 exited without working or printing
    assert (tiny_run / "samples.json").exists() and (tiny_run / "report.html").exists()
