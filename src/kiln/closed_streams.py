"""A reader that goes away (`kiln train | head`, a pager quit, a terminal hung up) does not
end the command.

Python ignores SIGPIPE, so a write to a pipe whose reader has closed raises
BrokenPipeError: from the progress bar or a log line that is training's end, exit status 1
and no word (the traceback itself goes to the closed pipe). A terminal that hung up (closed,
its ssh session dropped: `kiln.interrupts` makes the SIGHUP a clean stop) refuses writes
with OSError EIO, the same end. What was written there is a view of the run, not the run:
its records are in metrics.jsonl and its outputs in the run directory. So a stream whose
reader is gone is pointed at os.devnull (Python's documented remedy, which also stops the
interpreter's "Exception ignored ... BrokenPipeError" at exit) and the command goes on; the
other stream, if it is still read, says so once.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


def _reader_gone(e: OSError) -> str | None:
    """How the reader of a stream went away, as `e` says, or None if it did not."""
    if isinstance(e, BrokenPipeError):
        return "a pipe closed"
    if e.errno == errno.EIO:  # a terminal's writes after it hung up
        return "its terminal hung up"
    return None


class _ReaderMayLeave:
    """`stream`, with a write or flush that meets a closed reader sent to os.devnull."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream, self._name = stream, name
        self.closed_reader = False
        self._dropping = False  # a closed reader, and no descriptor to point at os.devnull

    def write(self, text: str) -> int:
        if self._dropping:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as e:
            if (how := _reader_gone(e)) is None:
                raise  # a full disk under a redirect is the user's to hear of
            self._reader_left(how)
            return len(text)

    def flush(self) -> None:
        if self._dropping:
            return
        try:
            self._stream.flush()
        except OSError as e:
            if (how := _reader_gone(e)) is None:
                raise
            self._reader_left(how)

    def _reader_left(self, how: str) -> None:
        if self.closed_reader:
            return
        self.closed_reader = True
        try:  # the descriptor itself: os.write (a signal's banner) and the exit flush too
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            self._stream.flush()  # what the pipe refused, to devnull now
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor
            self._dropping = True
        _said_elsewhere(self._name, how)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's own
        return getattr(self._stream, name)


def _said_elsewhere(name: str, how: str) -> None:
    other = sys.stderr if name == "stdout" else sys.stdout
    if isinstance(other, _ReaderMayLeave) and not other.closed_reader:
        print(f"kiln: the reader of {name} went away ({how}): what kiln writes there "
              "from here on is dropped; the command itself is not stopped", file=other)


@contextmanager
def readers_may_leave() -> Iterator[None]:
    """While inside, sys.stdout and sys.stderr survive their reader leaving; both are
    flushed on the way out, so nothing buffered meets the closed pipe at exit."""
    before = sys.stdout, sys.stderr
    if sys.stdout is not None:  # None (no stream at all): print() writes nothing, as before
        sys.stdout = _ReaderMayLeave(sys.stdout, "stdout")  # type: ignore[assignment]
    if sys.stderr is not None:
        sys.stderr = _ReaderMayLeave(sys.stderr, "stderr")  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _ReaderMayLeave):
                stream.flush()
        sys.stdout, sys.stderr = before
