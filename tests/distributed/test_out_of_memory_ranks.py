"""An out-of-memory under torchrun is said once, by the lowest rank that ran out, naming the
ranks that did: every rank that ran out said the same line, and a rank that met one of
them gone said that a rank "failed or was killed"."""

from __future__ import annotations

import time

import pytest
from launch import start_python

from distributed.test_signals_ranks import _ended, _kiln_lines

RUNS_OUT = """
import os, sys
from kiln import cli
from kiln.train.trainer import Trainer
ran_out = [int(r) for r in sys.argv[1].split(",")]
stepped = Trainer.train_step
def train_step(self):  # the allocator's own refusal, as a CPU rank meets it
    if self.step == 2 and int(os.environ["RANK"]) in ran_out:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 1073741824 bytes. "
                           "Error code 12 (Cannot allocate memory)")
    return stepped(self)
Trainer.train_step = train_step
sys.exit(cli.main(["train", sys.argv[2], "--set", "train.parallel=ddp"]))
"""


@pytest.mark.parametrize("ran_out, named", [("1", "rank 1"), ("0,1", "ranks 0, 1")],
                         ids=["one rank", "every rank"])
def test_an_out_of_memory_is_said_once_naming_the_ranks(tiny_run, tmp_path, ran_out, named):
    script = tmp_path / "runs_out.py"
    script.write_text(RUNS_OUT)
    procs, logs = start_python([str(script), ran_out, str(tiny_run)], world_size=2)
    deadline = time.monotonic() + 240
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = _ended(procs, logs)
    said = "\n".join(out for _, out in ended)
    assert [code for code, _ in ended] == [1, 1], said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    lines = _kiln_lines(said)
    assert len(lines) == 1, said[-3000:]
    assert lines[0].startswith(f"kiln: train: {named} ran out of memory (DefaultCPUAllocator: "
                               "can't allocate memory: you tried to allocate 1073741824 bytes): "
                               "lower train.micro_batch"), said[-3000:]
