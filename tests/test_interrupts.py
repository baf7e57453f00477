"""Outside training, SIGTERM stops `kiln` as Ctrl-C does: one line, exit 143, no traceback;
a repeated SIGTERM is the same stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.errors import Terminated
from kiln.interrupts import signals_stop_at_once

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def signals_as_in_a_terminal():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_sigterm_raises_once_and_the_handlers_come_back():
    with pytest.raises(Terminated) as stopped, signals_stop_at_once():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Terminated:
            os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, once another rank exited
            time.sleep(0.1)  # the handler ran and ignored it: the first stop goes on
            raise
    assert stopped.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `nohup`-like: the user's choice
    with signals_stop_at_once():
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler


TERMINATED_IN_PREPARE = """
import os, signal, sys, time
from kiln import cli
def prepare(cfg):  # a scheduler's SIGTERM while prepare runs
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
cli.cmd_prepare = prepare
cli.VERBS["prepare"] = (prepare, *cli.VERBS["prepare"][1:])
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("verb", ["prepare", "run"])
def test_sigterm_in_the_data_stages_is_one_line_and_exit_143(tmp_path, verb):
    """It used to end the process at once (killed by SIGTERM, not a word)."""
    script = tmp_path / "terminated.py"
    script.write_text(TERMINATED_IN_PREPARE)
    run = tmp_path / "run"
    args = [str(REPO / "recipes" / "quickstart.toml")] if verb == "run" else []
    done = subprocess.run([sys.executable, str(script), verb, *args, "--set", f'run.dir="{run}"'],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 143, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"kiln: {verb} stopped on SIGTERM; "), \
        done.stderr
    assert not (run / "prepare.json").exists() and not (run / "config.toml").exists()
