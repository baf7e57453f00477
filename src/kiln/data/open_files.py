"""Room for many open files: every memory-mapped token shard holds a file descriptor.

A split of 16M-token shards passes a common default `ulimit -n` of 1,024 at about 17B
tokens; the soft limit can be raised, without privileges, up to the hard one.
"""

from __future__ import annotations

import os
import resource

# descriptors left for everything else a training process opens (libraries, sockets, logs)
SPARE = 256


def _open_now() -> int:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def room_for_open_files(n: int) -> bool:
    """Whether `n` more files may stay open, raising the soft limit up to the hard one (as
    `ulimit -n` would) where needed; False when even the hard limit leaves too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _open_now() + n + SPARE
    if soft == resource.RLIM_INFINITY or want <= soft:
        return True
    if hard != resource.RLIM_INFINITY and want > hard:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return False
    return True
