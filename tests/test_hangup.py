"""A terminal that hangs up (closed, its ssh session dropped) under a foreground `kiln`: the
SIGHUP is a clean stop (training saves the step in flight), and the terminal's writes, which
now fail with EIO, are dropped rather than ending the command."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import sighup_would_end_the_process
from test_train import logged_losses, train_losses

from kiln.cli import main
from kiln.errors import Terminated
from kiln.interrupts import signals_stop_at_once
from kiln.train.checkpoint_dirs import checkpoint_step, latest_checkpoint
from kiln.train.stop_signals import StopRequests

pytestmark = pytest.mark.usefixtures("signals_as_in_a_terminal")


def _hung_up_terminal():
    """A line-buffered stream on a terminal that has hung up: its writes fail with EIO."""
    master, slave = os.openpty()
    os.close(master)
    return os.fdopen(slave, "w", buffering=1)


def test_a_hung_up_terminal_raises_eio():
    """The premise: not BrokenPipeError, which the closed-pipe guard alone caught."""
    master, slave = os.openpty()
    os.close(master)
    try:
        with pytest.raises(OSError) as met:
            os.write(slave, b"x\n")
    finally:
        os.close(slave)
    assert met.value.errno == 5 and not isinstance(met.value, BrokenPipeError)


def test_training_goes_on_when_its_terminal_hangs_up(tiny_run, monkeypatch):
    """The validation line after the hang-up raised OSError EIO: training ended with exit
    status 1 and the final checkpoint unwritten."""
    term = _hung_up_terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    try:
        assert main(["train", str(tiny_run), "--set", "train.steps=6"]) == 0
    finally:
        term.close()  # os.devnull's by now
    assert (tiny_run / "checkpoints" / "step_00000006").is_dir()


def test_a_hung_up_stdout_is_said_once_on_a_stderr_still_read(tiny_run, monkeypatch, capsys):
    term = _hung_up_terminal()
    assert main(["train", str(tiny_run), "--set", "train.steps=1"]) == 0
    monkeypatch.setattr(sys, "stdout", term)
    try:
        assert main(["generate", str(tiny_run)]) == 0
    finally:
        term.close()
    err = capsys.readouterr().err
    assert err.count("the reader of stdout went away (its terminal hung up)") == 1, err


def test_a_stop_while_starting_on_a_hung_up_terminal_is_still_a_clean_stop(monkeypatch):
    """A signal before any verb ran (importing torch): its line, written outside the
    guard, raised EIO."""
    import kiln.cli as cli

    def hung_up(argv):
        raise KeyboardInterrupt

    term = _hung_up_terminal()
    monkeypatch.setattr(cli, "_main", hung_up)
    monkeypatch.setattr(sys, "stderr", term)
    try:
        assert main(["--version"]) == 130
    finally:
        term.close()


def test_sighup_raises_terminated_with_the_status_of_a_hang_up():
    with pytest.raises(Terminated) as stopped, signals_stop_at_once():
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        except Terminated:
            os.kill(os.getpid(), signal.SIGHUP)  # torchrun's, passed on: the same stop
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            raise
    assert stopped.value.exit_code == 129 and str(stopped.value) == "SIGHUP"
    assert signal.getsignal(signal.SIGHUP) is sighup_would_end_the_process  # given back


def test_a_nohup_ignored_sighup_stays_ignored():
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with signals_stop_at_once():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    stops = StopRequests().install()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    stops.restore()


def test_sighup_in_training_saves_the_step_it_stopped_at(tiny_run):
    from test_stop_signals import SignalAt

    from kiln.errors import TrainingInterrupted
    from kiln.train.callbacks import default_callbacks

    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run, "train.checkpoint_every=1000",
                     callbacks=[SignalAt(4, signal.SIGHUP), *default_callbacks()])
    assert stopped.value.step == 4 and stopped.value.exit_code == 129
    assert "stopped on SIGHUP after step 4" in str(stopped.value)
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 4


def test_the_ranks_agree_on_the_strongest_signal(monkeypatch):
    """One rank hung up, another got Ctrl-C: they stop as hung up (129); a SIGTERM anywhere
    outranks both (143)."""
    import torch

    import kiln.train.stop_signals as stop_signals
    from kiln.parallel.distributed import DistEnv

    env = DistEnv(rank=0, world_size=2, local_rank=0, launched=True)

    def agreed(here: int | None, there: int | None) -> str | None:
        """What rank 0 (asked by `here`) agrees with rank 1 (asked by `there`)."""
        said = []
        monkeypatch.setattr(stop_signals, "all_reduce_sum", lambda t, env: said.append(t) or t)
        other = StopRequests()
        other.signal = there
        other.agreed(env, torch.device("cpu"))  # rank 1's flags, as it gives them
        monkeypatch.setattr(stop_signals, "all_reduce_sum", lambda t, env: t + said[0])
        stops = StopRequests()
        stops.signal = here
        return stops.agreed(env, torch.device("cpu"))

    assert agreed(signal.SIGINT, signal.SIGHUP) == "SIGHUP"
    assert agreed(signal.SIGHUP, None) == "SIGHUP"
    assert agreed(signal.SIGHUP, signal.SIGTERM) == "SIGTERM"
    assert agreed(signal.SIGINT, None) == "SIGINT"
    assert agreed(None, None) is None


def _wait_for_records(run_dir, proc, count: int, master: int | None = None) -> None:
    """Until `count` records are logged, reading the terminal (`master`) meanwhile, if any:
    a full one blocks its writer."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and len(logged_losses(run_dir)) >= count:
            return
        if master is None:
            time.sleep(0.02)
        elif select.select([master], [], [], 0.02)[0]:
            os.read(master, 65536)
    raise AssertionError("the run ended or hung before it could be signalled")


def test_kiln_train_in_a_terminal_that_hangs_up_saves_and_stops(tiny_run):
    """`kiln train` in the foreground of an ssh session that drops: the terminal goes, then
    SIGHUP. Python's default ended the process at once (killed by SIGHUP), with every step
    since the last periodic checkpoint lost; now it saves the step in flight and exits 129,
    its last lines to a terminal that is gone dropped without an error."""
    master, slave = os.openpty()
    cmd = [sys.executable, "-m", "kiln.cli", "train", str(tiny_run), "--set",
           "train.steps=2000", "--set", "train.checkpoint_every=1000", "--set",
           "train.eval_every=0"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdin=slave,
                            stdout=slave, stderr=slave,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    os.close(slave)
    try:
        _wait_for_records(tiny_run, proc, 3, master)
    finally:
        os.close(master)  # the terminal hangs up
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 129
    saved = checkpoint_step(latest_checkpoint(tiny_run / "checkpoints"))
    assert 3 <= saved < 1000 and max(logged_losses(tiny_run)) == saved


def test_kiln_train_under_nohup_trains_on_through_a_hang_up(tiny_run):
    """`nohup kiln train`: SIGHUP ignored is the user's choice, kept; the run goes on."""
    cmd = [sys.executable, "-m", "kiln.cli", "train", str(tiny_run), "--set",
           "train.steps=2000", "--set", "train.checkpoint_every=1000", "--set",
           "train.eval_every=0"]

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=nohup)
    try:
        _wait_for_records(tiny_run, proc, 3)
        proc.send_signal(signal.SIGHUP)
        _wait_for_records(tiny_run, proc, len(logged_losses(tiny_run)) + 3)  # trains on
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "SIGHUP" not in err
