"""Ctrl-C / SIGTERM stop training after the step in flight, with a checkpoint of that step."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from launch import free_port
from test_train import logged_losses, train_losses

from kiln.errors import TrainingInterrupted
from kiln.report.metrics_io import read_metrics
from kiln.train.callbacks import (
    Callback,
    Checkpointing,
    ProgressLog,
    Validation,
    default_callbacks,
)
from kiln.train.checkpoint_dirs import checkpoint_step, latest_checkpoint
from kiln.train.stop_signals import REPEAT_WINDOW_S, StopRequests

pytestmark = pytest.mark.usefixtures("signals_as_in_a_terminal")


def _terminal_signals() -> None:  # for a child process: what a terminal's shell gives it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SignalAt(Callback):
    """Sends this process `sig` while step `step` runs (before the checkpoint callback)."""

    def __init__(self, step: int, sig: int = signal.SIGINT) -> None:
        self.step, self.sig = step, sig

    def on_step_end(self, trainer, record) -> None:
        if trainer.step == self.step:
            os.kill(os.getpid(), self.sig)


def test_a_second_ctrl_c_stops_at_once_but_a_forwarded_copy_does_not():
    now = [100.0]
    stops = StopRequests(clock=lambda: now[0])
    stops.handle(signal.SIGINT)
    assert stops.signal == signal.SIGINT
    now[0] += REPEAT_WINDOW_S / 2  # torchrun forwarding the terminal's Ctrl-C to its ranks
    stops.handle(signal.SIGINT)
    stops.handle(signal.SIGTERM)  # torchrun's shutdown
    now[0] += REPEAT_WINDOW_S * 2
    with pytest.raises(KeyboardInterrupt):
        stops.handle(signal.SIGINT)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_the_step_it_stopped_at_and_resume_is_bitwise(tiny_run, tmp_path, sig,
                                                                     code):
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    _, straight = train_losses(tiny_run, "train.checkpoint_every=1000")
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(other, "train.checkpoint_every=1000",
                     callbacks=[SignalAt(4, sig), *default_callbacks()])
    assert stopped.value.step == 4 and stopped.value.exit_code == code
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert checkpoint_step(latest_checkpoint(other / "checkpoints")) == 4  # none was due

    _, resumed = train_losses(other, "train.checkpoint_every=1000")
    assert resumed == straight[4:]  # bitwise: nothing trained before the signal was lost
    assert logged_losses(other) == logged_losses(tiny_run)


def test_an_ignored_sigint_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stops = StopRequests().install()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == stops.handle
    stops.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_ctrl_c_on_the_last_step_saves_it_and_still_stops(tiny_run):
    """The run is complete, but the user asked to stop: `kiln run` must not go on to eval."""
    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run, callbacks=[SignalAt(12), *default_callbacks()])
    assert stopped.value.step == 12
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 12
    _, more = train_losses(tiny_run)
    assert more == []  # nothing left to train


def _signal_during_save(monkeypatch, at_step: int, sig: signal.Signals) -> None:
    """`sig` arrives while the checkpoint of `at_step` is written, after that step's own
    check of the stop flag."""
    from kiln.train import callbacks

    real_save = callbacks.save_checkpoint

    def save_then_signalled(root, step, *args, **kwargs):
        path = real_save(root, step, *args, **kwargs)
        if step == at_step:
            os.kill(os.getpid(), sig)
        return path

    monkeypatch.setattr(callbacks, "save_checkpoint", save_then_signalled)


def test_ctrl_c_while_the_last_checkpoint_is_written_still_stops(tiny_run, monkeypatch):
    """The signal comes after the last step's check, while its checkpoint is written (a
    large model's takes minutes): the message promised a stop, so training must not end as
    if complete (a `kiln run` would go on to eval and export)."""
    _signal_during_save(monkeypatch, 12, signal.SIGINT)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run)
    assert stopped.value.step == 12 and stopped.value.exit_code == 130
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 12
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


class Ends(Callback):
    """Records which of its end hooks ran (a sink that flushes metrics in on_train_end)."""

    def __init__(self) -> None:
        self.hooks: list[str] = []

    def on_train_end(self, trainer) -> None:
        self.hooks.append("end")

    def on_train_stopped(self, trainer) -> None:
        self.hooks.append("stopped")


def test_callbacks_after_checkpointing_still_end_when_a_stop_follows_its_last_check(tiny_run):
    """A recipe's order may put a callback after Checkpointing: a SIGTERM during its last
    on_step_end is seen in Checkpointing.on_train_end, and raised only once every callback
    has ended (a sink placed last flushes what it holds)."""
    before, after = Ends(), Ends()
    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run, callbacks=[before, *default_callbacks(),
                                          SignalAt(12, signal.SIGTERM), after])
    assert stopped.value.step == 12 and stopped.value.exit_code == 143
    assert before.hooks == after.hooks == ["end"]


def test_a_stop_still_validates_the_saved_step_when_validation_follows_checkpointing(
        tiny_run, monkeypatch):
    """Order [log, checkpoint, validate]: a SIGTERM during step 6's checkpoint write stops
    training after step 6, saved; step 6's validation still runs and is logged, where a
    resume (from step 7) would never measure it."""
    _signal_during_save(monkeypatch, 6, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run, callbacks=[ProgressLog(), Checkpointing(), Validation()])
    assert stopped.value.step == 6
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 6
    vals = [r["step"] for r in read_metrics(tiny_run / "metrics.jsonl") if r["kind"] == "val"]
    assert vals == [6]


def test_a_failing_on_train_end_still_releases_the_callbacks_after_it(tiny_run):
    class Fails(Callback):
        def on_train_end(self, trainer) -> None:
            raise RuntimeError("sink closed")

    before, after = Ends(), Ends()
    with pytest.raises(RuntimeError, match="sink closed"):
        train_losses(tiny_run, "train.steps=2", callbacks=[before, Fails(), after])
    assert before.hooks == ["end"] and after.hooks == ["stopped"]


def test_a_signal_during_a_periodic_checkpoint_write_stops_after_that_step(tiny_run,
                                                                            monkeypatch):
    """The signal comes while step 6's periodic checkpoint is written: the message said
    training stops after this step, and it is saved, so no step 7 is trained."""
    _signal_during_save(monkeypatch, 6, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stopped:
        train_losses(tiny_run)
    assert stopped.value.step == 6 and stopped.value.exit_code == 143
    assert checkpoint_step(latest_checkpoint(tiny_run / "checkpoints")) == 6
    assert max(logged_losses(tiny_run)) == 6


def _wait_for_records(run_dir, proc, count: int) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and len(logged_losses(run_dir)) >= count:
            return
        time.sleep(0.02)
    raise AssertionError("the run ended or hung before it could be signalled")


def test_kiln_train_on_ctrl_c_says_where_it_stopped(tiny_run):
    cmd = [sys.executable, "-m", "kiln.cli", "train", str(tiny_run), "--set",
           "train.steps=2000", "--set", "train.checkpoint_every=1000", "--set",
           "train.eval_every=0"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_terminal_signals)
    _wait_for_records(tiny_run, proc, 3)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-2000:]
    saved = checkpoint_step(latest_checkpoint(tiny_run / "checkpoints"))
    assert 3 <= saved < 1000 and max(logged_losses(tiny_run)) == saved
    assert f"stopped on SIGINT after step {saved}" in err
    assert "training stops after this step" in err
    assert f"`kiln train {tiny_run}` goes on from there" in err


def test_torchrun_ranks_stop_together_on_ctrl_c(tiny_run):
    """torchrun forwards the signal to both ranks; they agree on one step and save it."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "kiln.cli",
           "train", str(tiny_run), "--set", "train.steps=2000", "--set",
           "train.checkpoint_every=1000", "--set", "train.eval_every=0"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_terminal_signals)
    try:
        _wait_for_records(tiny_run, proc, 3)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = checkpoint_step(latest_checkpoint(tiny_run / "checkpoints"))
    assert 3 <= saved < 1000, err[-3000:]
    assert f"stopped on SIGINT after step {saved}" in err, err[-3000:]
    # the checkpoint is whole: both ranks reached the same step's save
    _, resumed = train_losses(tiny_run, "train.steps=" + str(saved + 2))
    assert len(resumed) == 2


@pytest.mark.parametrize("sig, said, unsaid", [
    (signal.SIGINT, "Ctrl-C again to stop at once", "SIGTERM"),
    (signal.SIGTERM, "a second SIGTERM is the same stop; Ctrl-C or SIGINT stops at once",
     "Ctrl-C again"),
    (signal.SIGHUP, "a second SIGHUP is the same stop; Ctrl-C or SIGINT stops at once",
     "Ctrl-C again")])
def test_the_stop_banner_names_what_stops_at_once_after_that_signal(monkeypatch, sig, said,
                                                                    unsaid):
    """After a SIGTERM (a scheduler's, a `kill`) the banner said "Ctrl-C again to stop at
    once": no Ctrl-C was pressed, and a second SIGTERM is ignored as the same stop."""
    import kiln.train.stop_signals as stop_signals

    banners: list[str] = []
    monkeypatch.setattr(stop_signals, "_say", banners.append)
    stops = StopRequests()
    stops.handle(sig)
    assert len(banners) == 1 and said in banners[0] and unsaid not in banners[0]


def test_a_waiting_rank_stopped_by_sigterm_is_not_told_to_press_ctrl_c_again(monkeypatch,
                                                                            capsys):
    """A rank waiting on rank 0 said "(Ctrl-C again to stop at once)" after a SIGTERM too."""
    from kiln.errors import Terminated
    from kiln.parallel.rank_waits import _say_stopping

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    _say_stopping(Terminated())
    err = capsys.readouterr().err
    assert "SIGTERM: waiting" in err and "Ctrl-C again" not in err
    assert "a second SIGTERM is the same stop; Ctrl-C or SIGINT stops at once" in err


def test_a_sigterm_after_trainings_stop_gave_its_handlers_back_is_the_same_stop():
    """A killed torchrun's kernel SIGTERMs its ranks once per thread of torchrun's that ends
    holding them: on a loaded machine a later one came as the rank left its process group,
    after training's handlers were given back, and raised there, a stop of its own ("train
    stopped on SIGTERM", each rank) in place of the step saved and said by rank 0. Training's
    stop (asked here, or agreed with another rank) is the stop under way."""
    from kiln.interrupts import signals_stop_at_once

    with signals_stop_at_once():
        stops = StopRequests().install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.signal == signal.SIGTERM
        stops.restore()  # training stopped: `kiln`'s handlers again, the group still to leave
        os.kill(os.getpid(), signal.SIGTERM)  # raised nothing: the same stop
        time.sleep(0.05)
