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


RUNS_OUT_LATER = """
import os, sys, time
from pathlib import Path
from kiln import cli
from kiln.train.trainer import Trainer
said = Path(sys.argv[1])  # rank 1 has said its line
if os.environ["RANK"] == "1":
    says = cli._out_of_memory_said
    def out_of_memory_said(*args):
        line = says(*args)
        said.write_text(str(line))
        return line
    cli._out_of_memory_said = out_of_memory_said
stepped = Trainer.train_step
def train_step(self):  # rank 1 runs out; rank 0 later, once rank 1 has said so and gone
    if self.step == 2:
        if os.environ["RANK"] == "0":
            for _ in range(2400):
                if said.exists():
                    break
                time.sleep(0.1)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 1073741824 bytes. "
                           "Error code 12 (Cannot allocate memory)")
    return stepped(self)
Trainer.train_step = train_step
sys.exit(cli.main(["train", sys.argv[2], "--set", "train.parallel=ddp"]))
"""


def test_a_rank_that_runs_out_after_the_line_was_said_does_not_say_it_again(tiny_run, tmp_path):
    """Rank 1 ran out, and said so for the ranks a second later (none other had); rank 0
    ran out later (a longer step's work before its next collective): it said the line
    again, naming rank 1 with itself ("ranks 0, 1 ran out of memory"), two lines for one
    problem. The first to say it says it; a rank that runs out after that says nothing."""
    script = tmp_path / "runs_out_later.py"
    script.write_text(RUNS_OUT_LATER)
    said = tmp_path / "said"
    procs, logs = start_python([str(script), str(said), str(tiny_run)], world_size=2)
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = _ended(procs, logs)
    output = "\n".join(out for _, out in ended)
    assert said.read_text().startswith("kiln: train: rank 1 ran out of memory ("), output[-3000:]
    assert [code for code, _ in ended] == [1, 1], output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = _kiln_lines(output)
    assert len(lines) == 1 and lines[0].startswith(said.read_text()), output[-3000:]


RESTARTED = """
import os
import torch
import torch.distributed as dist
from kiln.parallel import distributed, rank_stops
agent = dist.HashStore()  # torchrun's agent's store: kept over its restarts of the workers
distributed._rendezvous = lambda backend: agent
os.environ.update(TORCHELASTIC_RUN_ID="r", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
rank, world = dist.get_rank, dist.get_world_size
for attempt in ("0", "1"):
    os.environ["TORCHELASTIC_RESTART_COUNT"] = attempt
    env = distributed.init_distributed(torch.device("cpu"))
    dist.get_world_size = lambda: 2  # rank 1 of 2 in the first attempt, rank 0 in the next
    dist.get_rank = (lambda: 1) if attempt == "0" else (lambda: 0)
    if attempt == "0":
        rank_stops.leave_word(f"{rank_stops.RAN_OUT} (1 GiB)")
    else:
        print("read:", rank_stops.stopped_ranks(), rank_stops.ran_out_too(), flush=True)
    dist.get_rank, dist.get_world_size = rank, world
    distributed.shutdown(env)
"""


def test_a_restarted_attempt_does_not_read_the_earlier_ones_words(tmp_path):
    """torchrun --max-restarts keeps its agent's store over its restarts: rank 1's word
    that it ran out of memory in the first attempt was read by the next, so a rank 1 of the
    next killed outright (the kernel's OOM killer) was a rank that 'ran out of memory' to
    rank 0, which then said nothing, leaving it to a rank 1 that was gone."""
    import subprocess
    import sys

    script = tmp_path / "restarted.py"
    script.write_text(RESTARTED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read: {} []" in done.stdout, done.stdout + done.stderr[-3000:]
