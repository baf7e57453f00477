"""Which files a data source names, in a fixed order, with ids that do not depend on where they live."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Directories the embedded corpus leaves out: third-party code and test suites (odd encodings,
# deliberately broken syntax, huge generated data) are not the "standard library" we want to learn.
STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "testing", "__pycache__"}
)

# Walking a user's tree never descends into these (caches, VCS metadata, virtual environments).
TREE_SKIP_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".hg", ".svn", ".venv"})


@dataclass(frozen=True)
class SourceFile:
    """A file to read; `rel` is its stable id prefix (relative to the source root)."""

    path: Path
    rel: str


def stdlib_root() -> Path:
    """The standard library of the running interpreter: the default, always-present corpus."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk(root: Path, skip_dirs: frozenset[str], suffix: str | None = None) -> list[Path]:
    """All files under `root`, sorted by relative path, pruning `skip_dirs` and hidden entries."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or (suffix and not name.endswith(suffix)):
                continue
            found.append(Path(dirpath) / name)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def stdlib_files() -> list[SourceFile]:
    """The *.py files of the standard library, minus tests and installed packages."""
    root = stdlib_root()
    return [
        SourceFile(p, p.relative_to(root).as_posix())
        for p in _walk(root, STDLIB_SKIP_DIRS, suffix=".py")
    ]


def check_sources(sources: list[str]) -> None:
    """Fail early, naming the path, if a source does not exist."""
    for source in sources:
        if not Path(source).exists():
            raise FileNotFoundError(f"data source not found: {source!r}")


def list_source_files(sources: list[str]) -> list[SourceFile]:
    """Expand files and folders (recursively) into files; an empty list means the stdlib corpus."""
    if not sources:
        return stdlib_files()
    check_sources(sources)
    files = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            name = path.resolve().name
            files += [
                SourceFile(p, f"{name}/{p.relative_to(path).as_posix()}")
                for p in _walk(path, TREE_SKIP_DIRS)
            ]
        else:
            files.append(SourceFile(path, path.name))
    return files


def fingerprint_files(sources: list[str], exclude: Path | None = None) -> dict:
    """What the input files are now: count, bytes and a hash of (id, size, mtime) of each file.

    `sources` as for `list_source_files` (empty: the stdlib corpus). A path that does not exist
    is recorded as missing rather than raised (the stage that reads it reports that). Files
    under `exclude` (the run directory, if it lies inside a source folder) are left out, so
    prepare's own outputs never make a finished run look stale.
    """
    import hashlib

    digest = hashlib.sha256()
    n_files = n_bytes = 0
    excluded = exclude.resolve() if exclude is not None else None
    groups = [[s] for s in sources] if sources else [[]]
    for group in groups:
        if group and not Path(group[0]).exists():
            digest.update(f"missing\t{group[0]}\n".encode("utf-8", "surrogateescape"))
            continue
        for file in list_source_files(group):
            if excluded is not None and file.path.resolve().is_relative_to(excluded):
                continue
            try:
                st = file.path.stat()
            except OSError:
                digest.update(f"unstatable\t{file.rel}\n".encode("utf-8", "surrogateescape"))
                continue
            n_files += 1
            n_bytes += st.st_size
            line = f"{file.rel}\t{file.path}\t{st.st_size}\t{st.st_mtime_ns}\n"
            digest.update(line.encode("utf-8", "surrogateescape"))
    return {"files": n_files, "bytes": n_bytes, "sha256": digest.hexdigest()}
