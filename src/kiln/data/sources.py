"""Which files a data source names, in a fixed order, with ids that do not depend on where they live."""

from __future__ import annotations

import os
import stat
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.data import hf_cache

# Directories the embedded corpus leaves out: third-party code and test suites (odd encodings,
# deliberately broken syntax, huge generated data) are not the "standard library" we want to learn.
STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "testing", "__pycache__"}
)

# Walking a user's tree never descends into these (caches, VCS metadata, virtual environments).
TREE_SKIP_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".hg", ".svn", ".venv"})

# What the `read` stage reads (kiln.data.documents decides by suffix), as messages say it.
READ_FORMATS = ("text files (.txt, .md, source code; .txt.gz/.bz2/.xz/.zst), JSON lines (.jsonl, "
                ".ndjson; .gz/.bz2/.xz/.zst too), .json records (.gz/.bz2/.xz/.zst too) and .parquet")

# Read as text, these would be one document of markup or delimiters, not the text a user
# means: they are counted as skipped under these reasons, and the warning says what to do.
NOT_READ_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".html": "html", ".htm": "html",
                     ".xhtml": "html"}


@dataclass(frozen=True)
class SourceFile:
    """A file to read; `rel` is its stable id prefix (relative to the source root). `skip`
    names why it is not read at all (a hidden file, a pipe): the reader counts it."""

    path: Path
    rel: str
    skip: str | None = None


def printable_name(name: str) -> str:
    """A file name as valid UTF-8 text: bytes that are not UTF-8 (kept by Python as lone
    surrogates) become `\\xNN`, so ids and metadata can be written as JSON."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def stdlib_root() -> Path:
    """The standard library of the running interpreter: the default, always-present corpus."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk(root: Path, skip_dirs: frozenset[str], suffix: str | None = None,
          keep_hidden: bool = False) -> list[tuple[Path, str | None]]:
    """(file, why it is skipped or None) under `root`, sorted by relative path. Prunes
    `skip_dirs` and hidden folders; follows folder links once (a link loop is not followed
    again). Hidden files and anything that is not a regular file (a named pipe would block
    the reader forever) are listed with a reason when `keep_hidden`, else left out, as are
    folders that cannot be listed ('unreadable_dir': their files are not silently lost)."""
    found = list(_walk_unsorted(root, skip_dirs, suffix, keep_hidden))
    return sorted(found, key=lambda f: f[0].relative_to(root).as_posix())


def _walk_unsorted(root: Path, skip_dirs: frozenset[str], suffix: str | None = None,
                   keep_hidden: bool = False) -> Iterator[tuple[Path, str | None]]:
    """`_walk`'s files as the folders are listed, so a caller may stop at the first."""
    seen = {os.path.realpath(root)}
    unlisted_dirs: list[tuple[Path, str | None]] = []

    def unlisted(error: OSError) -> None:
        if keep_hidden and error.filename:
            unlisted_dirs.append((Path(error.filename), "unreadable_dir"))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=unlisted):
        yield from unlisted_dirs
        unlisted_dirs.clear()
        # a Hugging Face cache's refs/ and blobs/ are not data (kiln.data.hf_cache)
        # (by the folder's own name: a source may be a link to it under another)
        cache_dirs = hf_cache.bookkeeping_dirs(os.path.basename(os.path.realpath(dirpath)),
                                               dirnames)
        not_data = hf_cache.files_not_data(dirpath, dirnames)
        kept = []
        for d in sorted(dirnames):
            real = os.path.realpath(os.path.join(dirpath, d))
            if d in skip_dirs or d.startswith(".") or d in cache_dirs or real in seen:
                continue
            seen.add(real)
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            if suffix and not name.endswith(suffix):
                continue
            path = Path(dirpath) / name
            if name in not_data or hf_cache.holds_access_token(str(path)):
                continue
            why = "hidden" if name.startswith(".") else _not_regular(path)
            if why is None or keep_hidden:
                yield path, why
    yield from unlisted_dirs


def _not_regular(path: Path) -> str | None:
    """'not_regular' for pipes, sockets and devices; a dangling link is left to the reader
    (it counts it unreadable)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else "not_regular"


def stdlib_files() -> list[SourceFile]:
    """The *.py files of the standard library, minus tests and installed packages."""
    root = stdlib_root()
    return [
        SourceFile(p, p.relative_to(root).as_posix())
        for p, _ in _walk(root, STDLIB_SKIP_DIRS, suffix=".py")
    ]


def check_sources(sources: list[str]) -> None:
    """Fail early, naming the path, if a source does not exist. A relative one is read from
    the current folder, not the recipe's: the message says which folder that was, since a
    recipe run from elsewhere is the usual cause."""
    for source in sources:
        if not Path(source).exists():
            where = "" if Path(source).is_absolute() else \
                f" (relative to the current folder {os.getcwd()}, not to the recipe's; " \
                "run kiln from the folder it is relative to, or give an absolute path)"
            if any(c in source for c in "*?["):  # a TOML list is not a shell: nothing expands it
                where += "; wildcards are not expanded: name the folder (every file under it " \
                    "is read) or list the files"
            raise FileNotFoundError(f"data.sources: {source!r} does not exist{where}")


def list_source_files(sources: list[str], exclude: Path | None = None) -> list[SourceFile]:
    """Expand files and folders (recursively) into files; an empty list means the stdlib corpus.

    Each file once, however many sources name it (`d` and `d/`, a folder and its subfolder,
    links to one file), under a name with a suffix where one of them has it: the reader
    knows a file's format by its suffix, and a Hugging Face cache folder holds each file as
    `blobs/<sha256>` and a link to it, `snapshots/<commit>/train.jsonl` (first in path order,
    the blob's JSON lines were one text document of JSON); the cache's `refs/` and `blobs/`
    are not walked (kiln.data.hf_cache: `refs/main` was a document). Nothing under `exclude` (the run
    directory, when it lies inside a source folder or a link in one points at it: prepare
    must not read its own outputs)."""
    if not sources:
        return stdlib_files()
    check_sources(sources)
    excluded = os.path.realpath(exclude) if exclude is not None else None
    files: list[SourceFile] = []
    seen: dict[str, int] = {}  # real path -> its place in `files`
    for source in sources:
        path = Path(source)
        if path.is_dir():
            name = path.resolve().name
            found = [
                SourceFile(p, printable_name(f"{name}/{p.relative_to(path).as_posix()}"), why)
                for p, why in _walk(path, TREE_SKIP_DIRS, keep_hidden=True)
            ]
        else:
            found = [SourceFile(path, printable_name(path.name), _not_regular(path))]
        for file in found:
            real = os.path.realpath(file.path)
            if excluded and (real + os.sep).startswith(excluded + os.sep):
                continue
            if real in seen:
                kept = files[seen[real]]
                if file.skip is None and _suffix(file) and not _suffix(kept):
                    files[seen[real]] = file  # the name that says the file's format
                continue
            seen[real] = len(files)
            files.append(file)
    return files


def _suffix(file: SourceFile) -> str:
    return Path(file.rel).suffix


def sources_without_files(sources: list[str], exclude: Path | None = None) -> list[str]:
    """The sources in which no file is found (an empty folder, one holding only hidden or
    skipped folders, a path gone since): named, so 'no documents' does not read as a
    reader that skipped everything."""
    return [s for s in sources if not _has_file(Path(s), exclude)]


def _has_file(source: Path, exclude: Path | None) -> bool:
    """Whether `list_source_files([source], exclude)` finds a file: stops at the first, not a
    second walk of a 100,000-file corpus (with a realpath per file) after prepare read it."""
    if not source.exists():
        return False
    if not source.is_dir():
        return bool(list_source_files([str(source)], exclude))
    excluded = os.path.realpath(exclude) if exclude is not None else None
    return any(excluded is None or not (os.path.realpath(p) + os.sep).startswith(excluded + os.sep)
               for p, _ in _walk_unsorted(source, TREE_SKIP_DIRS, keep_hidden=True))


def no_files_message(empty: list[str]) -> str:
    """Why nothing came from `empty` (sources without a file), and what is read."""
    skipped = " and ".join(sorted(d for d in TREE_SKIP_DIRS if not d.startswith(".")))
    return (f"no file found in {', '.join(repr(s) for s in empty)}: hidden folders, "
            f"{skipped} are not searched; the read stage reads {READ_FORMATS}")


def fingerprint_files(sources: list[str], exclude: Path | None = None,
                      known: dict | None = None, by: str = "content",
                      record: dict | None = None) -> dict:
    """What the input files are now: count, bytes and a hash of (id, size, content) of each file.

    `sources` as for `list_source_files` (empty: the stdlib corpus). A path that does not exist
    is recorded as missing rather than raised (the stage that reads it reports that). Files
    under `exclude` (the run directory, if it lies inside a source folder) are left out, so
    prepare's own outputs never make a finished run look stale. Contents, not modification
    times: a touch, a fresh checkout or a copy of the same files is the same input. `known`
    (real path -> [size, mtime_ns, ctime_ns, inode, content sha256], updated in place)
    spares re-reading the files whose size, times and inode are unchanged since it was filled;
    `record`, if given, receives the entry of every file hashed now (a cache of these files
    only). `by="mtime"` gives the fingerprint runs recorded before contents were hashed (times
    instead of contents).
    """
    import hashlib

    if by not in ("content", "mtime"):
        raise ValueError(f"fingerprint by 'content' or 'mtime', not {by!r}")
    known = {} if known is None else known
    record = known if record is None else record
    digest = hashlib.sha256()
    n_files = n_bytes = 0
    groups = [[s] for s in sources] if sources else [[]]
    for group in groups:
        if group and not Path(group[0]).exists():
            digest.update(f"missing\t{group[0]}\n".encode("utf-8", "surrogateescape"))
            continue
        for file in list_source_files(group, exclude):
            if file.skip:  # never read (hidden, not a regular file): not part of the input
                continue
            try:
                st = file.path.stat()
                what = (st.st_mtime_ns if by == "mtime"
                        else _content_hash(file.path, st, known, record))
            except OSError:
                digest.update(f"unstatable\t{file.rel}\n".encode("utf-8", "surrogateescape"))
                continue
            n_files += 1
            n_bytes += st.st_size
            # not the path as spelled (`d`, `d/`, absolute): the same files are the same input
            line = f"{file.rel}\t{st.st_size}\t{what}\n"
            digest.update(line.encode("utf-8", "surrogateescape"))
    out = {"files": n_files, "bytes": n_bytes, "sha256": digest.hexdigest()}
    return out if by == "mtime" else {**out, "by": "content"}


def _content_hash(path: Path, st: os.stat_result, known: dict, record: dict) -> str:
    """sha256 of the file's bytes, from `known` while its size and times are unchanged; its
    entry goes into `record`."""
    from kiln.hashing import file_sha256

    key = os.path.realpath(path)
    # the inode change time moves with any write and with a time set back (`touch -r`,
    # `cp -p`, `rsync -t`), so an edit that keeps the size and mtime is re-read too
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    seen = known.get(key)
    if not (isinstance(seen, list) and len(seen) == 5 and seen[:4] == stamp
            and isinstance(seen[4], str)):
        seen = [*stamp, file_sha256(path)]
    record[key] = seen
    return seen[4]
