"""What torch's C++ logs while the ranks connect a group, said after it, unless a lost rank
ended the connection.

A rank that dies while another still connects a gloo group (rank 0 of a hand launch,
killed as the ranks start: it also hosts their store) fails that rank's store calls inside
gloo's `connectFullMesh`, and each failure is logged to fd 2 by the TCPStore client with
its C++ frames ("recvValueWithTimeout failed ... frame #0 ..."), some 25 lines a call,
before the error reaches Python, where `kiln` says it in one line ("another rank of this
launch failed or was killed"). The log is not Python's to silence: TORCH_CPP_LOG_LEVEL
would hide every C++ warning of the process for its whole life. So fd 2 goes to a file
while the ranks connect (nothing else runs then), and is written back after: all of it,
unless the connection failed on a lost rank, when only the C++ log records are left out
(the frames of the failure `kiln` then names); any other line is written back.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# a C++ log record and its frames: "[rank1]:[W1207 05:33:37.27 TCPStore.cpp:138] ...",
# "Exception raised from ...", "frame #3: ...", "<omitting python frames>"
_NATIVE = re.compile(r"^(\[rank\d+\]:)?\[[IWEF]\d{4} |^Exception raised from |^frame #\d+: |"
                     r"^<omitting python frames>$|^$")


@contextmanager
def native_log_held(lost: Callable[[RuntimeError], bool]) -> Iterator[None]:
    """Inside, fd 2 is held in a file; written back on the way out, without the C++ log
    records when a RuntimeError for which `lost` holds (a lost rank) ends the block."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        held = tempfile.TemporaryFile()
    except (OSError, ValueError):  # no stream to keep apart, or no file to hold it: as it is
        yield
        return
    with held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        dropped = False
        try:
            yield
        except RuntimeError as e:
            dropped = lost(e)
            raise
        finally:
            try:
                if sys.stderr is not None:
                    sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            _write_back(held.read(), dropped)


def _write_back(said: bytes, without_native: bool) -> None:
    if without_native:
        lines = said.decode(errors="replace").splitlines(keepends=True)
        said = "".join(line for line in lines if not _NATIVE.match(line.rstrip("\n")))\
            .encode()
    try:
        view = memoryview(said)
        while view:
            view = view[os.write(2, view):]
    except OSError:  # its reader gone: nothing more can be said
        pass
