"""A `kiln train --fresh` of 2 ranks killed while rank 0 moved the earlier model's outputs
to archive/, then a plain 2-rank `kiln train`: every rank goes on with that fresh start
(`Resuming._go_on_with_a_start_cut_short`, whose `_check_ranks_agree(None)` meets the
others in the collective a resume meets them in), the archive folder is finished, and the
run trains from step 0 to its end."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_config
from launch import run_python, run_ranks

from kiln.report import read_metrics
from kiln.train.checkpoint_dirs import checkpoint_step, latest_checkpoint
from kiln.train.trainer import Trainer

STEPS = ["--set", "train.steps=3", "--set", "train.checkpoint_every=3"]

# rank 0 killed (os._exit, as SIGKILL leaves things) as it moves metrics.jsonl aside: the
# checkpoints are in the archive folder already, its .unfinished mark still there
KILLED_IN_ITS_ARCHIVE = """
import os, sys
real = os.replace
def replace(src, dst, *a, **k):
    if os.environ["RANK"] == "0" and "metrics.jsonl" in str(src) and "archive" in str(dst):
        os._exit(137)
    return real(src, dst, *a, **k)
os.replace = replace
from kiln.cli import main
sys.exit(main(["train", sys.argv[1], "--fresh", *sys.argv[2:]]))
"""


def _killed_fresh_start(run: Path, script: Path) -> Path:
    Trainer(tiny_config(run, "train.steps=3", "train.checkpoint_every=3")).fit()
    script.write_text(KILLED_IN_ITS_ARCHIVE)
    with pytest.raises(RuntimeError, match="rank 0 exited 137"):
        run_python([str(script), str(run), *STEPS], world_size=2, timeout=180)
    (begun,) = (run / "archive").iterdir()
    assert (begun / ".unfinished").is_file() and (begun / "checkpoints").is_dir()
    assert not (run / "checkpoints").exists() and (run / "metrics.jsonl").is_file()
    return begun


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_go_on_with_a_fresh_start_cut_short(tiny_run, tmp_path, parallel):
    begun = _killed_fresh_start(tiny_run, tmp_path / "killed.py")
    outs = run_ranks(["train", str(tiny_run), *STEPS, "--set", f"train.parallel={parallel}"],
                     world_size=2, timeout=240, every_rank=True)
    assert "cut short" in outs[0] and "resumed from" not in outs[0], outs[0]
    assert "cut short" not in outs[1] and "Traceback" not in "".join(outs), outs
    # one archive folder, finished, holding the whole earlier model
    assert [p.name for p in (tiny_run / "archive").iterdir()] == [begun.name]
    assert sorted(p.name for p in begun.iterdir()) == ["checkpoints", "config.toml", "env.json",
                                                       "metrics.jsonl", "model.json"]
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 3
    steps = [r["step"] for r in read_metrics(tiny_run / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2, 3]  # from step 0, the earlier run's records all in the archive
