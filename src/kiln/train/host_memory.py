"""Keep freed tensor memory inside the process on CPU.

glibc serves large allocations with fresh `mmap`s and hands freed ones back to the
kernel, so every big activation a training step allocates is page-faulted in again, one
4 KiB page at a time. On the virtual machines we run on that costs more than the maths:
a 64 MB tensor copy took 16.6 ms with the defaults and 4.8 ms with freed memory kept, and
a (4096 x 512) @ (512 x 8192) bf16 matmul 35 ms against 14 ms. A training loop allocates
the same sizes every step, so the kept memory is reused rather than grown.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_applied = False


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to stop using mmap for large blocks and never trim the heap.

    Process-wide and idempotent; returns whether it took effect (False off glibc Linux,
    where there is nothing to do: other allocators already cache large blocks or the
    platform does not expose mallopt)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and friends have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _applied
