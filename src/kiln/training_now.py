"""Whether a trainer holds a run now (torch-free, for `kiln report` as well as the data
verbs): a report made mid-run read the steps logged past the latest checkpoint as a killed
run's, and told the user a resume would train them again."""

from __future__ import annotations

import fcntl
from pathlib import Path

TRAIN_LOCK = ".train.lock"  # `kiln.run_dir.training_lock` holds it while a run trains


def trainer_holding(run_dir: Path) -> str | None:
    """Who trains `run_dir` now ("pid N on HOST", as the trainer wrote it), or None: none
    does (none ever did, it ended, or was killed: the kernel drops a dead process's lock),
    the lock file is not ours to read, or its filesystem takes no locks (NFS without its
    lock service: ENOLCK; a trainer could hold none there either, and `kiln report` failed
    with a traceback). Only looked at, with a shared lock held for microseconds
    (`training_lock` asks again for a while before it names a holder)."""
    try:  # read-only: another user's trainer may have made the file, and flock needs no write
        f = open(Path(run_dir) / TRAIN_LOCK, encoding="utf-8", errors="replace")
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "another process"
        except OSError:  # no locks on this filesystem
            return None
        fcntl.flock(f, fcntl.LOCK_UN)
    return None
