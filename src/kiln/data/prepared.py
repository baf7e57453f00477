"""Read back the documents `kiln prepare` wrote (RUN/documents/NNNNN.jsonl.gz), all or none.

`kiln tokenizer` and `kiln tokenize` read them; a document lost on the way (a damaged
gzip member, a bad line, a file deleted) would make shards that silently describe less
than prepare reported, and a stray file would add to them. So a damaged file is one error
naming the file and line, and the documents read are counted against what prepare.json
says the writer wrote (`documents_out`, `bytes_out`): files added, removed or edited since
are refused, not trained on. datatrove's JsonlReader logs a bad line and goes on.

A file edited with its counts kept (a word changed for another of the same length) is caught
by its sha256, which prepare records in prepare.json (`documents_sha256`) as it finishes; the
check re-hashes a file only where its stat changed since (`kiln.data.shard_hashes`), so it
costs a stat per file. A prepare.json from before Kiln recorded them has none to check.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
from datatrove.data import Document

from kiln.data.shard_hashes import HASH_KEY, check_file_hashes, record_checked
from kiln.errors import RunDataError
from kiln.hashing import file_sha256

DOCUMENTS = "documents"
SUMMARY = "prepare.json"
# what prepare's writer names its files (datatrove's `${rank}.jsonl`, gzipped)
WRITTEN = re.compile(r"\d+\.jsonl\.gz")
REMAKE = "make them again: `kiln prepare --set prepare.resume=false`"
HASHES = "documents_sha256"  # prepare.json: {file name under documents/: sha256}
# the stat each documents hash was taken at (`shard_hashes.record_checked`), beside documents/:
# the folder holds the documents alone
DOCS_CHECKED = ".documents-checked.json"


def _files(docs_dir: Path) -> list[Path]:
    """Every `*.jsonl.gz` under the folder (what datatrove's reader, recursive, would take),
    in path order: prepare's own files first come in rank order."""
    return sorted((p for p in docs_dir.rglob("*.jsonl.gz") if p.is_file()),
                  key=lambda p: p.relative_to(docs_dir).as_posix())


def _stray(docs_dir: Path, files: list[Path]) -> list[str]:
    return [p.relative_to(docs_dir).as_posix() for p in files
            if p.parent != docs_dir or not WRITTEN.fullmatch(p.name)]


def _expected(summary: Path) -> tuple[int, int] | None:
    """(documents, bytes) the finished prepare wrote, or None where prepare.json cannot say."""
    try:
        made = json.loads(summary.read_text(encoding="utf-8"))
        docs, n_bytes = made["documents_out"], made["bytes_out"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if type(docs) is not int or type(n_bytes) is not int:
        return None
    return docs, n_bytes


def prepared_count(run_dir: Path | str) -> int | None:
    """The documents the finished prepare wrote (a progress bar's end), or None if unknown."""
    expected = _expected(Path(run_dir) / SUMMARY)
    return expected[0] if expected else None


def hash_documents(run_dir: Path | str, recorded: dict[str, str] | None = None,
                   written_since: float = 0.0) -> dict[str, str]:
    """The sha256 of each documents file, for prepare.json, as prepare finishes; their stats
    go in `DOCS_CHECKED`, so a later check hashes only the files changed since.

    `recorded`: the hashes an earlier finish of the same prepare took (a resume). They stand
    for the files this prepare did not write again (modified before `written_since`), so an
    edit made since is still told from what prepare made; a file a resumed task wrote again
    (a gzip header holds its time: other bytes) is hashed anew, and the next check, finding
    no stat for it, confirms it once."""
    docs_dir = Path(run_dir) / DOCUMENTS
    if recorded is None:
        hashes = {p.relative_to(docs_dir).as_posix(): file_sha256(p) for p in _files(docs_dir)}
        if hashes:  # no documents: nothing to record
            record_checked(docs_dir, hashes, Path(run_dir) / DOCS_CHECKED)
        return hashes
    hashes = {}
    for path in _files(docs_dir):
        name = path.relative_to(docs_dir).as_posix()
        kept = name in recorded and path.stat().st_mtime < written_since
        hashes[name] = recorded[name] if kept else file_sha256(path)
    return hashes


def recorded_hashes(run_dir: Path | str) -> dict[str, str] | None:
    """What prepare.json records of the documents files, or None (a prepare from before Kiln
    recorded them, or none finished)."""
    try:
        hashes = json.loads((Path(run_dir) / SUMMARY).read_text(encoding="utf-8")).get(HASHES)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        return None
    return hashes


def _edited(path: Path, got: str, want: str) -> RunDataError:
    return RunDataError(
        f"{path} is not the file `kiln prepare` wrote (its sha256 {got[:16]}, "
        f"{path.parent.parent / SUMMARY} records {want[:16]}): edited since `kiln prepare`, or "
        f"another file put in its place; {REMAKE} (edited documents go in as data.sources)")


def check_documents_unchanged(run_dir: Path | str,
                              refuse: Callable[[Path, str, str], RunDataError] = _edited) -> bool:
    """Refuse (RunDataError naming the file) a documents file whose bytes are not those
    prepare hashed; False where prepare.json records no hashes (nothing to check), else
    True. Files added or removed are `documents_renamed`'s, and read_documents counts them."""
    hashes = recorded_hashes(run_dir)
    if hashes is None:
        return False
    docs_dir = Path(run_dir) / DOCUMENTS
    check_file_hashes(docs_dir, [{"file": name, HASH_KEY: h} for name, h in hashes.items()
                                 if (docs_dir / name).is_file()], refuse,
                      Path(run_dir) / DOCS_CHECKED)
    return True


def documents_renamed(run_dir: Path | str) -> list[str]:
    """The documents files added or removed since prepare hashed them ('+name', '-name'):
    with the same counts (a file renamed), other documents in another order."""
    hashes = recorded_hashes(run_dir)
    if hashes is None:
        return []
    docs_dir = Path(run_dir) / DOCUMENTS
    now = {p.relative_to(docs_dir).as_posix() for p in _files(docs_dir)} if docs_dir.is_dir() else set()
    return sorted(f"+{n}" for n in now - set(hashes)) + sorted(f"-{n}" for n in set(hashes) - now)


def _damaged(path: Path, where: str, why: str) -> RunDataError:
    return RunDataError(f"{path}{where}: {why}; the prepared documents are damaged, {REMAKE}")


def _check_gzip(path: Path) -> None:
    """Raise what reading `path` to its end raises: a damaged deflate stream can decode to
    garbage, which the line reader meets before gzip's CRC check at the member's end does,
    and the error should name the cause (the file is damaged) rather than its symptom."""
    with gzip.open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def _read_file(path: Path, name: str, counts: list[int]) -> Iterator[Document]:
    """The documents of one file, as datatrove's reader makes them (id, metadata); a record
    with empty text is counted (prepare's meter counted it) and skipped, as datatrove does."""
    line_no = 0
    try:
        with gzip.open(path, "rb") as f:
            for line_no, line in enumerate(f, start=1):
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    _check_gzip(path)  # garbage from a damaged member reads as a bad record first
                    raise _damaged(path, f" line {line_no}", f"not a JSON record ({e.msg} at column {e.colno})") from e
                text = record.get("text") if isinstance(record, dict) else None
                if not isinstance(text, str):
                    _check_gzip(path)
                    raise _damaged(path, f" line {line_no}", "a record without a `text` string")
                counts[0] += 1
                counts[1] += len(text.encode("utf-8"))
                if not text:
                    continue
                metadata = record.pop("metadata", {})
                if not isinstance(metadata, dict):
                    metadata = {"metadata": metadata}
                record.pop("text")
                record.pop("media", None)  # prepare's documents hold none
                doc_id = record.pop("id", f"{name}/{line_no - 1}")
                yield Document(text=text, id=doc_id, metadata=metadata | record)
    except (EOFError, OSError, zlib.error) as e:  # cut off, or a damaged gzip member
        raise _damaged(path, f" after line {line_no}" if line_no else "",
                       f"unreadable gzip ({type(e).__name__}: {e})") from e


def _damaged_or_edited(path: Path, got: str, want: str) -> RunDataError:
    """A file changed since prepare: its damage (a cut gzip, a bad line) named as such where
    it has one, found by reading it through; else it was edited."""
    for _ in _read_file(path, path.name, [0, 0]):
        pass
    return _edited(path, got, want)


def read_documents(out_dir: Path | str) -> Iterator[Document]:
    """Documents `kiln prepare` (`kiln.data.pipeline.run_prepare`) wrote under out_dir, in file
    then line order; RunDataError for a damaged file (naming it and the line), an empty
    folder, or documents that are not the ones prepare.json counts."""
    docs_dir = Path(os.path.abspath(out_dir)) / DOCUMENTS
    summary = Path(out_dir) / SUMMARY
    if summary.exists() and not docs_dir.is_dir():
        raise FileNotFoundError(f"`kiln prepare` wrote no documents in {out_dir} (see {summary}); "
                                "fix data.sources and run `kiln prepare` again")
    if not summary.exists() or not docs_dir.is_dir():
        raise FileNotFoundError(f"no prepared documents in {out_dir}; run `kiln prepare` first")
    files, expected = _files(docs_dir), _expected(summary)
    if not files:
        raise RunDataError(f"{docs_dir} holds no documents (*.jsonl.gz) although {summary} "
                           f"records {expected[0] if expected else 'some'}; {REMAKE}")
    check_documents_unchanged(out_dir, _damaged_or_edited)  # a stat per file
    counts = [0, 0]  # documents, UTF-8 bytes of their text
    for path in files:
        yield from _read_file(path, path.relative_to(docs_dir).as_posix(), counts)
    if expected is not None and tuple(counts) != expected:
        stray = _stray(docs_dir, files)
        raise RunDataError(
            f"{docs_dir} holds {counts[0]:,} documents ({counts[1]:,} bytes) where {summary} "
            f"records {expected[0]:,} ({expected[1]:,} bytes): files were added, removed or "
            f"edited since `kiln prepare`"
            + (f" (not written by it: {', '.join(stray[:5])})" if stray else "")
            + f"; {REMAKE} (edited documents go in as data.sources)")
    if renamed := documents_renamed(out_dir):
        raise RunDataError(f"{docs_dir} holds other files than `kiln prepare` wrote and {summary} "
                           f"records ({', '.join(renamed[:6])}); {REMAKE}")
