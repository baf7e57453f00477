"""A reader that goes away (`kiln train | head`, a pager quit) does not end the command."""

from __future__ import annotations

import os
import subprocess
import sys

from kiln.cli import main


def _closed_pipe():
    """A line-buffered stream whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    return os.fdopen(write, "w", buffering=1)


def test_training_goes_on_when_the_reader_of_its_output_goes_away(tiny_run, monkeypatch):
    """`kiln train 2>&1 | head -5`: the progress bar met BrokenPipeError once head exited,
    and training ended with exit status 1, no word and no final checkpoint."""
    broken = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", broken)
    monkeypatch.setattr(sys, "stderr", broken)
    try:
        assert main(["train", str(tiny_run)]) == 0
    finally:
        broken.close()  # os.devnull's by now
    assert (tiny_run / "checkpoints" / "step_00000012").is_dir()


def test_a_closed_stdout_is_said_once_on_a_stderr_still_read(tiny_run, monkeypatch, capsys):
    """`kiln generate RUN | head -1`: the samples after the pipe closed are dropped, and
    stderr says why once."""
    broken = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", broken)
    try:
        assert main(["train", str(tiny_run)]) == 0
        assert main(["generate", str(tiny_run)]) == 0
    finally:
        broken.close()
    err = capsys.readouterr().err
    assert err.count("the reader of stdout went away") == 1
    assert "BrokenPipe" not in err


def test_no_broken_pipe_message_at_exit(tiny_run):
    """`kiln generate RUN` with its stdout's reader gone: a BrokenPipeError traceback (or,
    for output still buffered, "Exception ignored ... BrokenPipeError" at exit)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "kiln", "train", str(tiny_run)], env=env,
                   capture_output=True, timeout=300, check=True)
    p = subprocess.Popen([sys.executable, "-m", "kiln", "generate", str(tiny_run)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # the reader is gone before a word is written
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0, err
    assert "BrokenPipe" not in err and "Exception ignored" not in err


def test_no_stdout_at_all_still_writes_nothing(monkeypatch):
    """A process started without stdout (sys.stdout is None): print() writes nothing, and
    the guard for a closed reader must not turn that into an AttributeError."""
    import pytest

    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
