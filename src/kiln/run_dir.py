"""The run directory is the unit of work: resolved config, environment, model figures."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kiln.atomic import process_gone, write_json_atomic, write_text_atomic
from kiln.config import Config, config_to_toml
from kiln.data.path_options import anchored as anchored_paths
from kiln.errors import ConfigError, KilnError
from kiln.training_now import TRAIN_LOCK, trainer_holding

_PACKAGES = ("torch", "numpy", "tokenizers", "safetensors", "datatrove", "transformers", "kiln")


def run_arg(run_dir: Path) -> str:
    """The run directory as a command line the user pastes names it (quoted where the shell
    would split it: a path with spaces)."""
    return shlex.quote(str(run_dir))


def git_hash() -> str:
    """The commit of the Kiln checkout this code runs from (`-dirty` with changes to its
    tracked files), or "unknown". Only a repository that tracks Kiln's own source counts:
    Kiln installed into a virtual environment inside another project (`my-project/.venv`,
    ignored by its git) found that project's repository above site-packages, and recorded
    its commit and changes as Kiln's."""
    here = Path(__file__).resolve()

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=here.parent)

    try:
        if git("ls-files", "--error-unmatch", "--", here.name).returncode != 0:
            return "unknown"  # not a checkout of Kiln: no repository, or another's
        out = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: str = "") -> dict[str, Any]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git_hash": git_hash(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
        "versions": versions,
    }


def version_line() -> str:
    """`kiln --version`: the facts env.json records of a run, for the code that would make one
    (Kiln's version from its package metadata, else the source's own; the git commit where
    Kiln runs from a checkout)."""
    env = environment()
    kiln = env["versions"]["kiln"] or __import__("kiln").__version__
    git = "" if env["git_hash"] == "unknown" else f" (git {env['git_hash']})"
    return f"kiln {kiln}{git}, torch {env['torch']}, python {env['python']}"


def write_run_metadata(cfg: Config, device: str = "") -> None:
    """config.toml (resolved) and env.json (git hash, library versions) in the run dir.

    data.sources (and the [prepare] options naming files, `kiln.data.path_options`) are
    recorded as absolute paths: `kiln prepare RUN` or `kiln run RUN` from another directory
    reads the same folders (a relative path names the folder it named in
    the directory the run was started from; the run directory is found by where it is)."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    anchored = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, sources=[os.path.abspath(s) for s in cfg.data.sources]),
        prepare=anchored_paths(cfg.prepare))
    write_text_atomic(run_dir / "config.toml", config_to_toml(anchored))
    write_json_atomic(run_dir / "env.json", environment(device))


_PROBE = ".kiln-probe-"  # + host-pid-random: `check_run_dir_writable`'s folder
_PROBE_LIFE_S = 3600  # a probe lives for microseconds: one this old was left by a kill


def clear_killed_probes(folder: Path) -> None:
    """The empty probe folders that commands killed inside `check_run_dir_writable` left in
    `folder` (the run's parent, not the run: a user's folder): those of this host whose
    process is gone, and any an hour old (another host's on a shared disk, or an older
    Kiln's, named without its process). rmdir removes an empty folder alone."""
    for probe in folder.glob(f"{_PROBE}*"):
        host, _, pid = probe.name[len(_PROBE):].rpartition("-")[0].rpartition("-")
        try:
            if (host == platform.node() and process_gone(pid)) or \
                    time.time() - probe.lstat().st_mtime > _PROBE_LIFE_S:
                os.rmdir(probe)
        except OSError:  # not empty (not a probe's), gone already, or not ours to remove
            continue


def check_run_dir_writable(cfg: Config, may_make: bool) -> None:
    """Before a verb's work: the run directory must be a folder this user can write, or
    (`may_make`: the data verbs and `kiln run` start a run) one this user can make. Met
    later, mkdir's own error on an impossible path (`/proc/x`: "[Errno 2] No such file or
    directory") or a read-only filesystem's named neither run.dir nor what to do."""
    run_dir = cfg.run_dir
    if may_make and not run_dir.is_dir():
        # the kernel alone tells (/proc refuses a root that may write anywhere): a folder of
        # this process's own where the run's first missing one goes, removed at once, so a
        # command refused later leaves nothing made, and ranks probing together never race
        above = next(p for p in run_dir.absolute().parents if p.exists())
        clear_killed_probes(above)
        try:
            os.rmdir(tempfile.mkdtemp(prefix=f"{_PROBE}{platform.node()}-{os.getpid()}-",
                                      dir=above))
        except OSError as e:
            raise ConfigError(f"run.dir: cannot make the folder {run_dir} ({e.strerror or e} "
                              f"in {above}): set run.dir to a folder this user can write") from e
        return
    if not run_dir.is_dir() or os.access(run_dir, os.W_OK):
        return
    read_only = os.statvfs(run_dir).f_flag & os.ST_RDONLY
    raise ConfigError(f"run.dir: {run_dir} is "
                      + ("on a read-only filesystem" if read_only else "not writable by this user")
                      + ": Kiln writes its outputs there; make it writable, or set run.dir to a "
                      "folder that is")


def refuse_while_training(run_dir: Path) -> None:
    """The data verbs and `kiln run` re-make documents, tokenizer and shards, and record
    config.toml: under a trainer of the same run (before its first checkpoint, which alone
    makes them refuse other data settings) they replaced the tokenizer and config.toml it
    was training with, and the shards its next validation reads. Refused while a trainer
    holds `training_lock`; the lock is only looked at, never kept."""
    holder = trainer_holding(run_dir)
    if holder is not None:
        raise KilnError(f"{run_dir} is being trained by {holder}: its data cannot be "
                        "made again under it; wait for it, or stop it first")


_LOOK_S = 1.0  # far longer than `refuse_while_training` holds its shared lock (microseconds)


def _took_lock(f: Any) -> bool:
    """The trainer's exclusive lock on `f`. A refusal may be only `refuse_while_training`
    looking (a data verb or `kiln run` starting): that shared lock is gone within moments,
    so it is asked again for `_LOOK_S` before a trainer is named as holding the run."""
    deadline = time.monotonic() + _LOOK_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


@contextlib.contextmanager
def training_lock(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir/.train.lock` while a run trains: a second trainer on the same run would
    clear the first one's checkpoint in progress and interleave its metrics. The kernel
    drops the lock when the process ends, however it ends, so a killed run leaves none."""
    if not run_dir.is_dir():  # no run yet: training will say what to run first
        yield
        return
    with open(run_dir / TRAIN_LOCK, "a+") as f:
        if not _took_lock(f):
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise KilnError(f"{run_dir} is being trained by {holder}; wait for it, or stop it "
                            "first (two trainers on one run would overwrite each other)") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {platform.node()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

