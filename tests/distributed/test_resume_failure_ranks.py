"""A resume that fails on one rank alone (its node's copy of a checkpoint damaged, a file
missing there, a loader position it cannot take) stops every rank with the same status and one line, rank 0's, naming the
file and the rank that found it. Rank 0 said another rank "failed or was killed", or
blamed its own checkpoint for the collective the failed rank left, and the failed rank
said its error as well."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import as_written, tiny_config
from launch import run_python

from kiln.train.trainer import Trainer

# each rank resumes its own copy of the run: one shared folder mounted at other paths on
# each node (`run.dir` may differ by rank), one copy damaged
BY_RANK = """
import os, sys
from kiln.cli import main
sys.exit(main(["train", sys.argv[1 + int(os.environ["RANK"])], "--set", "train.parallel=fsdp"]))
"""


def _copies(tiny_run: Path, tmp_path: Path) -> list[Path]:
    """Two copies of a run with a checkpoint of step 6 (FSDP2 on 2 ranks reads it whole)."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=6")).fit()
    copies = [tmp_path / "node0", tmp_path / "node1"]
    for copy in copies:
        shutil.copytree(tiny_run, copy)
    return copies


def _said_once_by_rank_zero(script: Path, text: str, args: list[str]) -> str:
    """Run `text` as `script` on 2 ranks with `args`: both exit 1, rank 0 says one `kiln:`
    line and rank 1 none, no traceback; returns rank 0's line."""
    script.write_text(text)
    with pytest.raises(RuntimeError) as failed:
        run_python([str(script), *args], world_size=2, timeout=120)
    said = str(failed.value)
    assert "rank 0 exited 1:" in said and "rank 1 exited 1:" in said, said
    rank0, rank1 = said.split("rank 0 exited 1:", 1)[1].split("rank 1 exited 1:", 1)
    assert "Traceback" not in said, said
    lines = [line for line in rank0.splitlines() if line.startswith("kiln:")]
    assert len(lines) == 1, rank0
    assert not any(line.startswith("kiln:") for line in rank1.splitlines()), rank1
    return lines[0]


def _damage(ckpt: Path, how: str) -> str:
    """Damage rank 1's copy of `ckpt` so; returns what rank 0 is to say of it."""
    if how == "missing":
        (ckpt / "optimizer.pt").unlink()
        return f"checkpoint {ckpt} is unreadable (FileNotFoundError: "
    if how == "loader":  # its loader's position taken on other token shards (the sums agree)
        state = torch.load(ckpt / "trainer.pt", weights_only=True)
        state["loader"]["data"] = "0" * 64
        torch.save(state, ckpt / "trainer.pt")
        as_written(ckpt)
        return f"cannot resume from {ckpt}: the loader state was saved on other token shards"
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    return f"checkpoint {ckpt} is unreadable (ValueError: model.safetensors is not what was written"


@pytest.mark.parametrize("how", ["damaged", "missing", "loader"])
def test_a_resume_failing_on_rank_one_alone_is_said_once_by_rank_zero(tiny_run, tmp_path, how):
    copies = _copies(tiny_run, tmp_path)
    ckpt = copies[1] / "checkpoints" / "step_00000006"
    expected = _damage(ckpt, how)
    line = _said_once_by_rank_zero(tmp_path / "by_rank.py", BY_RANK, [*map(str, copies)])
    assert line.startswith(f"kiln: rank 1 could not resume: {expected}"), line


FULL_ON_RANK_ZERO = """
import errno, os, sys
from kiln.cli import main
from kiln.train import run_records
if os.environ["RANK"] == "0":  # rank 0 alone writes the run's files: its disk is full
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    run_records.set_aside_records_after = full  # where the trainer looks it up
sys.exit(main(["train", sys.argv[1], "--set", "train.parallel=fsdp", "--set", "train.steps=12"]))
"""


def test_a_resume_whose_records_rank_zero_cannot_write_is_said_once(tiny_run, tmp_path):
    """Rank 0 sets aside what an earlier stretch logged after the checkpoint, alone: its
    failure reached rank 1 as a lost rank at the first step ("another rank of this launch
    failed or was killed"), a second line for one problem."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=6")).fit()
    line = _said_once_by_rank_zero(tmp_path / "full.py", FULL_ON_RANK_ZERO, [str(tiny_run)])
    assert line.startswith("kiln: cannot write metrics.jsonl"), line
    assert "No space left on device" in line


SLOW_EXIT_ON_RANK_ZERO = """
import atexit, os, runpy, sys, time
if os.environ["RANK"] == "0":  # its way out outlasts rank 1's: torchrun's SIGTERM meets it
    atexit.register(time.sleep, 3)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_under_torchrun_every_rank_exits_with_the_agreed_status(tiny_run, tmp_path):
    """torchrun SIGTERMs the ranks still running once one has exited: rank 0, on its way out
    with the same error as rank 1, was ended by that signal (torchrun: "exitcode : -15
    (SIGTERM)" for rank 0, 1 for rank 1)."""
    from distributed.test_signals_ranks import HANG_S, _torchrun

    copies = _copies(tiny_run, tmp_path)
    _damage(copies[1] / "checkpoints" / "step_00000006", "damaged")
    for name, text in (("by_rank.py", BY_RANK), ("slow_exit.py", SLOW_EXIT_ON_RANK_ZERO)):
        (tmp_path / name).write_text(text)
    launcher = _torchrun(tmp_path, [str(tmp_path / "slow_exit.py"), str(tmp_path / "by_rank.py"),
                                    *map(str, copies)])
    try:
        launcher.wait(timeout=HANG_S + 60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = (tmp_path / "torchrun.log").read_text(errors="replace")
    assert sorted(re.findall(r"exitcode\s*: (-?\d+) \(pid", output)) == ["1", "1"], output
    said = [line for line in output.splitlines() if ":kiln:" in line]
    assert len(said) == 1 and said[0].startswith("[default0]:kiln: rank 1 could not resume: "), output


def test_ranks_holding_different_copies_of_a_step_are_refused(tiny_run, tmp_path):
    """Each node's own copy of the run, one holding another valid checkpoint of the same
    step (a stale copy; here one trained at another learning rate, the same data order):
    every file matched its own sums, so each rank loaded its own weights and FSDP trained
    on a mix of the two, silently. Now refused, the ranks named, said once by rank 0."""
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    copies = _copies(tiny_run, tmp_path)
    Trainer(tiny_config(other, "train.parallel=fsdp", "train.steps=6", "optim.lr=1e-3")).fit()
    step = copies[1] / "checkpoints" / "step_00000006"
    shutil.rmtree(step)
    shutil.copytree(other / "checkpoints" / "step_00000006", step)
    line = _said_once_by_rank_zero(tmp_path / "by_rank.py", BY_RANK, [*map(str, copies)])
    assert line.startswith("kiln: the ranks hold different copies of checkpoint "
                           "step_00000006 (their checksums.json differ: rank 0 holds one, "
                           "rank 1 another; rank 0's is "), line
    assert not (copies[0] / "checkpoints" / "step_00000012").exists()


SHARED = """
import sys
from kiln.cli import main
sys.exit(main(["train", sys.argv[1], "--set", sys.argv[2], "--set", "train.steps=9"]))
"""


def _tamper_optimizer_state(ckpt: Path, how: str) -> None:
    """An optimizer.pt that unpickles, its sums recorded (`as_written`): refused by the
    checks of its contents, which rank 0 alone reads."""
    path = ckpt / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    if how == "no moments":
        state["state"] = {}
    elif how == "a list":
        state = [state]
    elif how == "a moment missing":  # torch's own refusal, midway through the sending
        del state["state"][next(iter(state["state"]))]
    else:
        moments = next(iter(state["state"].values()))
        moments["exp_avg"] = torch.zeros(3)
    torch.save(state, path)
    as_written(ckpt)


@pytest.mark.parametrize("parallel, how", [
    ("fsdp", "no moments"), ("fsdp", "a list"), ("ddp", "no moments"),
    ("fsdp", "a moment of another shape"), ("ddp", "a moment missing")])
def test_an_optimizer_state_refused_on_rank_zero_is_said_for_every_rank(
        tiny_run, tmp_path, parallel, how):
    """Rank 0 alone reads optimizer.pt (it sends each rank its part): its refusal of the
    file's contents stopped rank 0 alone, and rank 1, waiting for its part, met a lost rank
    ("another rank of this launch failed or was killed") in place of the reason. Now every
    rank stops with the status of the refusal, said once by rank 0."""
    Trainer(tiny_config(tiny_run, f"train.parallel={parallel}", "train.steps=6",
                        "train.checkpoint_every=3")).fit()
    ckpt = tiny_run / "checkpoints" / "step_00000006"
    _tamper_optimizer_state(ckpt, how)
    line = _said_once_by_rank_zero(tmp_path / "shared.py", SHARED,
                                   [str(tiny_run), f"train.parallel={parallel}"])
    assert line.startswith(f"kiln: rank 0 could not resume: checkpoint {ckpt} is unreadable ("), line
    assert "optimizer.pt" in line and "previous one, step_00000003" in line, line


def test_a_callbacks_state_refused_on_resume_is_said_once(tiny_run, tmp_path):
    """A callback's saved state (trainer.pt's, which every rank reads) refused as the run
    starts: every rank raised it on its own, and said it (the same line once per rank)."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=6",
                        "train.checkpoint_every=3")).fit()
    ckpt = tiny_run / "checkpoints" / "step_00000006"
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    state["callbacks"]["ProgressLog"]["loss"] = "x"
    torch.save(state, ckpt / "trainer.pt")
    as_written(ckpt)
    line = _said_once_by_rank_zero(tmp_path / "shared.py", SHARED,
                                   [str(tiny_run), "train.parallel=fsdp"])
    assert line.startswith(f"kiln: rank 0 could not resume: checkpoint {ckpt} is unreadable "
                           "(ValueError: trainer.pt: the ProgressLog window's 'loss' is 'x')"), line


@pytest.mark.parametrize("left", ["a latest pointer", "a trained model's outputs"])
def test_no_checkpoint_to_go_on_from_is_said_once(tiny_run, tmp_path, left):
    """A run whose checkpoints are gone, with a `latest` pointer still naming one, or with
    its trained model's outputs: refused by every rank, each saying the same line."""
    Trainer(tiny_config(tiny_run, "train.parallel=fsdp", "train.steps=6",
                        "train.checkpoint_every=3")).fit()
    for ckpt in (tiny_run / "checkpoints").glob("step_*"):
        shutil.rmtree(ckpt)
    if left == "a trained model's outputs":
        (tiny_run / "checkpoints" / "latest").unlink()
        (tiny_run / "eval.json").write_text("{}")
    line = _said_once_by_rank_zero(tmp_path / "shared.py", SHARED,
                                   [str(tiny_run), "train.parallel=fsdp"])
    assert line.startswith("kiln: rank 0 could not resume: "), line
    assert "no complete checkpoint is left" in line or "but no checkpoint to resume from" in line
