"""Outside training, SIGTERM stops `kiln` as Ctrl-C does: one line, exit 143, no traceback;
a repeated SIGTERM is the same stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kiln.errors import Terminated
from kiln.interrupts import signals_stop_at_once

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("signals_as_in_a_terminal")


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
from kiln.commands import run as run_chain
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal's
def prepare(cfg):  # a scheduler's SIGTERM (or a terminal's SIGHUP) while prepare runs
    os.kill(os.getpid(), getattr(signal, os.environ.get("KILN_TEST_SIGNAL", "SIGTERM")))
    time.sleep(30)
run_chain.cmd_prepare = prepare  # as `kiln run` calls it
cli.VERBS["prepare"] = (prepare, *cli.VERBS["prepare"][1:])
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("verb", "sig", "code"), [
    ("prepare", "SIGTERM", 143), ("run", "SIGTERM", 143),
    ("prepare", "SIGHUP", 129), ("run", "SIGHUP", 129)])
def test_a_stop_signal_in_the_data_stages_is_one_line_and_its_exit_status(tmp_path, verb, sig,
                                                                         code):
    """It used to end the process at once (killed by SIGTERM, or by SIGHUP when a terminal
    closed, not a word)."""
    script = tmp_path / "terminated.py"
    script.write_text(TERMINATED_IN_PREPARE)
    run = tmp_path / "run"
    args = [str(REPO / "recipes" / "quickstart.toml")] if verb == "run" else []
    done = subprocess.run([sys.executable, str(script), verb, *args, "--set", f'run.dir="{run}"'],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "KILN_TEST_SIGNAL": sig})
    assert done.returncode == code, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"kiln: {verb} stopped on {sig}; "), \
        done.stderr
    assert not (run / "prepare.json").exists() and not (run / "config.toml").exists()


def test_a_stop_during_tokenizer_training_comes_at_once():
    """HF tokenizers' BPE training holds the main thread in native code: a SIGTERM during
    it was raised only once training returned (minutes on a large corpus)."""
    from tokenizers import pre_tokenizers

    from kiln.data.tokenizer import train_bpe

    released, all_read = threading.Event(), threading.Event()

    def texts():
        yield from ["the cat sat on the mat"] * 50
        os.kill(os.getpid(), signal.SIGTERM)  # while the training reads: it is in native code
        released.wait(30)  # a long corpus (or merges) still ahead
        all_read.set()

    stopped_in_training = None
    with pytest.raises(Terminated), signals_stop_at_once():
        try:
            train_bpe(texts(), 300, pre_tokenizers.ByteLevel(add_prefix_space=False),
                      show_progress=False)
        finally:
            stopped_in_training = not all_read.is_set()
            released.set()
    assert stopped_in_training


def test_what_native_work_raises_is_raised_in_the_main_thread():
    from kiln.interrupts import taking_signals

    assert taking_signals(lambda: 7) == 7
    with pytest.raises(ValueError, match="bad input"):
        taking_signals(lambda: int("bad input"))


def test_a_lost_rank_is_said_in_a_few_words():
    """gloo's message was cut at 200 characters, mid-word, after its source path."""
    from kiln.parallel.rank_stops import lost_rank_said

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                        "Connection closed by peer [127.0.0.1]:13733. This is typically caused "
                        "by a remote worker crashing. Check the logs of the remote worker.")
    assert lost_rank_said(gloo) == "Connection closed by peer [127.0.0.1]:13733"
    assert lost_rank_said(RuntimeError()) == "RuntimeError"
