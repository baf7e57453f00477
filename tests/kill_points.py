"""Run the `kiln` CLI in a subprocess that dies (os._exit, as a SIGKILL leaves things: no
`finally`, no atexit) when a chosen function is called: the state a kill at that point
leaves behind, for the re-run to cope with."""

from __future__ import annotations

import subprocess
import sys

KILLED = 137  # the status os._exit gives here, as a shell shows a SIGKILL's

_SCRIPT = f"""
import importlib, os, sys
module, attr, nth, matching = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
owner = importlib.import_module(module)
real, calls = getattr(owner, attr), [0]
def killed(*args, **kwargs):
    if matching in repr(args):
        calls[0] += 1
        if calls[0] >= nth:
            os._exit({KILLED})
    return real(*args, **kwargs)
setattr(owner, attr, killed)
from kiln.cli import main
sys.argv = ["kiln", *sys.argv[5:]]
sys.exit(main())
"""


def kiln_killed_at(target: str, *args: str, nth: int = 1, matching: str = "",
                   timeout: float = 300) -> subprocess.CompletedProcess:
    """`kiln ARGS`, killed at the `nth` call of `target` ("module:function", looked up by
    callers through that module at call time) whose arguments' repr holds `matching`."""
    module, attr = target.split(":")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, module, attr, str(nth), matching,
                           *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == KILLED, f"not killed at {target}: {proc.stdout}{proc.stderr}"
    return proc
