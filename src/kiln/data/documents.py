"""Raw sources -> datatrove Documents, as a pipeline step, so every executor can run it.

Bad input (non-UTF-8, binary, empty, malformed lines, unreadable files) is counted by reason
and skipped: a yield report is more useful than a crash halfway through a corpus.

The text is the record's `text` field (a parquet file's `text` column), or the one named by
`data.text_field` (`content`, `raw_content` in many datasets). Every field of a record but its
text (a JSON record's keys, a parquet row's other columns) goes into `doc.metadata`, as datatrove's own readers do: later stages judge by it (Brain Rot
M1 by `likes`, `retweets`...; dating by `year`, `date`, `title`, an arXiv `id`...).

Here: the files listed and sharded, text files and JSON lines, and what is kept of a text;
a .json's many shapes are read in kiln.data.json_documents, parquet in
kiln.data.parquet_documents, a record's metadata made in kiln.data.record_fields.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger
from tqdm import tqdm
from zstandard import ZstdError

from kiln.data.json_depth import MAX_JSON_DEPTH, NestedTooDeep, deeper_than
from kiln.data.json_documents import JsonReading
from kiln.data.json_records import text_key_pattern
from kiln.data.long_documents import (
    MAX_DOCUMENT_CHARS,
    PART_OF,
    split_long_text,
    split_text_stream,
)
from kiln.data.parquet_documents import ParquetReading
from kiln.data.prepared import read_documents  # noqa: F401 (read back where it was always imported)
from kiln.data.record_fields import DEFAULT_TEXT_FIELD, record_fields
from kiln.data.skip_examples import SkipExamples, note_fields, write_task_examples
from kiln.data.sources import (
    NOT_READ_SUFFIXES,
    SourceFile,
    check_sources,
    list_source_files,
    printable_name,
)
from kiln.data.text_files import decoded_chunks, read_head, scan_text
from kiln.data.zstd_files import open_zstd

# Compressed text and JSON lines, by the compressor's suffix (the standard library's, and
# zstandard's: the format the Pile and many large datasets ship in).
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zst": open_zstd}
JSONL_SUFFIXES = tuple(f"{base}{z}" for base in (".jsonl", ".ndjson") for z in ("", *OPENERS))
TEXT_COMPRESSED = tuple(f".txt{z}" for z in OPENERS)
# .json compressed: C4 (allenai/c4) ships its JSON lines as `.json.gz`
JSON_SUFFIXES = tuple(f".json{z}" for z in ("", *OPENERS))
# What a cut (EOFError, every opener) or damaged compressed file raises (lzma's and zstd's
# errors are neither an OSError nor an EOFError)
DAMAGED = (EOFError, OSError, zlib.error, lzma.LZMAError, ZstdError)

# Suffixes that are never text; skipped without being read.
BINARY_SUFFIXES = frozenset(
    ".pyc .pyo .so .o .a .dll .exe .bin .pt .npy .npz .png .jpg .jpeg .gif .ico .pdf .zip .gz"
    " .tar .tgz .bz2 .xz .zst .whl .woff .woff2 .ttf .otf .mp3 .mp4 .wav".split()
)


class SourceReader(JsonReading, ParquetReading, PipelineStep):
    """Read txt / jsonl (both also .gz / .bz2 / .xz / .zst) / parquet / source-code files (or
    the stdlib corpus) into Documents.

    CSV and HTML files are counted as skipped (`csv`, `html`), not read: as raw text they
    would be a table's delimiters or a page's markup (`NOT_READ_SUFFIXES`).

    Files are sharded across datatrove tasks by index (file i goes to rank i % world_size).
    `counts` mirrors the datatrove stats as a plain dict so callers can write it to JSON.

    `text_field` names the record field / parquet column read as the text (`data.text_field`).
    Metadata: Kiln's `source` (the file) and `bytes` (of the text), then every other field of
    the record (JSON) or row (parquet); a nested `metadata` object is merged in, as datatrove
    merges it (top-level fields win). A record's own `source` / `bytes` is kept as
    `record_source` / `record_bytes`. A record's `id` keeps its name: it cannot collide (the
    document id is `file:line`, and the writer nests metadata), and dating reads arXiv ids
    there. A field JSON cannot hold (bytes, a decimal, an int past 64 bits, a lone surrogate)
    would stop the writer: it is left out and counted (`fields/dropped_unwritable`).

    Every skip is also noted, for the first few files of each reason, with the file and the
    line (jsonl), row (parquet) or entry (a .json list) where it happened (`examples`); with
    `examples_dir`, each task writes its own there (kiln.data.skip_examples), for prepare to
    name them.
    """

    type = "📖 - READER"
    name = "🔥 Kiln sources"

    def __init__(self, sources: list[str], max_bytes: int = 0, progress: bool = True,
                 exclude: Path | None = None, text_field: str = DEFAULT_TEXT_FIELD,
                 examples_dir: Path | None = None):
        """`exclude`: a folder never read (the run directory, see `list_source_files`)."""
        super().__init__()
        check_sources(sources)
        if not isinstance(text_field, str) or not text_field.strip():
            raise ValueError(f"the text field must be a non-empty name, not {text_field!r}")
        self.sources = list(sources)
        self.exclude = exclude
        self.max_bytes = max_bytes
        self.progress = progress
        self.text_field = text_field
        self._text_key = text_key_pattern(text_field)
        self.examples_dir = examples_dir
        self.examples = SkipExamples()
        self._file: tuple[int, str] = (0, "")  # the file being read: listing order, name
        self._where: tuple[str, int] | None = None  # the line / row / entry in it
        self._key: str | None = None  # the key path of a .json object's records
        self.counts: Counter[str] = Counter()

    def _count(self, label: str, value: int = 1) -> dict | None:
        """Count `label`; a skip is noted in `examples` too (its example, if one is kept)."""
        self.counts[label] += value
        self.stat_update(label, value=value)
        if label.startswith("skipped/"):
            return self.examples.add(label[len("skipped/"):], *self._file, value, self._where,
                                     self._key)
        return None

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if data:
            yield from data
        self.examples = SkipExamples()  # this task's (one instance may run several in turn)
        yield from self._read_files(rank, world_size)
        if self.examples_dir is not None:
            write_task_examples(self.examples_dir, rank, self.examples)

    def _read_files(self, rank: int, world_size: int) -> Iterator[Document]:
        files = list_source_files(self.sources, self.exclude)[rank::world_size]
        kept = 0
        for i, file in enumerate(tqdm(files, desc=f"read rank {rank}", unit="file",
                                      disable=not self.progress)):
            # its place in the whole listing: examples merge across tasks in that order
            self._file, self._where = (rank + i * world_size, printable_name(str(file.path))), None
            self._key = None
            for doc in self._read_file(file):
                yield doc
                kept += doc.metadata["bytes"]
                if self.max_bytes and kept >= self.max_bytes:
                    return

    def _documents(self, text: str, doc_id: str, path: Path,
                   fields: dict | None = None) -> Iterator[Document]:
        """The document of one text; a text over `MAX_DOCUMENT_CHARS` is cut into parts
        (kiln.data.long_documents) with ids `<id>#1`, `<id>#2`... (the same metadata, plus
        `part_of`: the text's id, which keeps its parts on one side of the train/val split),
        made one at a time, and counted (`long_texts_split`, `parts`)."""
        if len(text) <= MAX_DOCUMENT_CHARS:
            if doc := self._make(text, doc_id, path, fields):
                yield doc
            return
        yield from self._parts(split_long_text(text), len(text), doc_id, path, fields)

    def _parts(self, parts: Iterable[str], n_chars: int, doc_id: str, path: Path,
               fields: dict | None = None) -> Iterator[Document]:
        """The documents of the `parts` of a text of `n_chars` characters (over the limit)."""
        self._count("long_texts_split")
        logger.warning(f"{doc_id}: a text of {n_chars:,} characters, over the "
                       f"{MAX_DOCUMENT_CHARS:,} a document may hold: read as parts {doc_id}#1, "
                       f"#2... cut at paragraph, line or word breaks (kiln.data.long_documents)")
        for k, part in enumerate(parts, start=1):
            self._count("parts")
            if doc := self._make(part, f"{doc_id}#{k}", path, fields):
                doc.metadata[PART_OF] = doc_id
                yield doc

    def _make(self, text: str, doc_id: str, path: Path,
              fields: dict | None = None) -> Document | None:
        if not text.strip():
            self._count("skipped/empty")
            return None
        try:
            n_bytes = len(text) if text.isascii() else len(text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate ("\ud800" is valid JSON): skip the document
            self._count("skipped/invalid_unicode")
            return None
        self._count("documents")
        self._count("bytes", n_bytes)
        metadata = {"source": printable_name(str(path)), "bytes": n_bytes}
        if fields:
            metadata |= self._writable(fields)
        return Document(text=text, id=doc_id, metadata=metadata)

    def _writable(self, fields: dict) -> dict:
        """`fields` less those the JSON writer (orjson) would refuse, each counted: one odd
        field must not stop the pipeline at the write step, nor lose its document."""
        try:
            orjson.dumps(fields)
            return fields
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
        kept = {}
        for key, value in fields.items():
            try:
                orjson.dumps({key: value})
                kept[key] = value
            except TypeError:
                self._count("fields/dropped_unwritable")
        return kept

    def _read_file(self, file: SourceFile) -> Iterator[Document]:
        if file.skip:  # hidden, or not a regular file (a pipe would block forever)
            self._count(f"skipped/{file.skip}")
            return
        name = file.path.name.lower()  # DATA.JSONL is JSONL too
        try:
            if name.endswith(JSONL_SUFFIXES):
                yield from self._read_jsonl(file)
            elif name.endswith(JSON_SUFFIXES):
                yield from self._read_json(file, _opener(name))
            elif name.endswith(".parquet"):
                yield from self._read_parquet(file)
            elif name.endswith(TEXT_COMPRESSED):
                yield from self._read_text_file(file, _opener(name))
            elif file.path.suffix.lower() in BINARY_SUFFIXES:
                self._count("skipped/binary")
            elif reason := NOT_READ_SUFFIXES.get(file.path.suffix.lower()):
                self._count(f"skipped/{reason}")  # markup or a table: not text as it is
            else:
                yield from self._read_text_file(file)
        except (*DAMAGED, ValueError):  # ArrowInvalid is a ValueError
            self._where = self._key = None  # the file, not the line it had reached
            self._count("skipped/unreadable")

    def _read_text_file(self, file: SourceFile, opener=open) -> Iterator[Document]:
        """A text file, or a .txt.gz / .bz2 / .xz / .zst (`opener`). Cut off (a truncated
        download: EOFError), the text before the cut is what was written, and is kept as the
        file's document, counted `unreadable_rest_of_file` with the line where it was cut, as a
        cut .jsonl.gz keeps its records. Damaged (any other error), the bytes before the error
        may already be garbage (gzip checks its CRC only at the end): the file is
        `unreadable`. A file over `WHOLE_TEXT_BYTES` is read in chunks, twice
        (kiln.data.text_files): the same documents, in memory that does not grow with it."""
        with opener(file.path, "rb") as f:
            chunks, whole, cut = read_head(f)
        if whole:
            yield from self._read_text(file, b"".join(chunks), cut=cut)
            return
        del chunks
        scan = scan_text(lambda: opener(file.path, "rb"))
        if scan.skip:  # as `_read_text` decides (naming the line of a stray byte, as it does)
            if scan.skip == "non_utf8" and scan.non_utf8_line is not None:
                self._where = ("line", scan.non_utf8_line)
            self._count(f"skipped/{scan.skip}")
            self._where = None
            return
        if scan.cut:
            self._where = ("line", scan.newlines + 1)
            self._count("skipped/unreadable_rest_of_file")
            self._where = None
            if scan.blank:
                return
        texts = decoded_chunks(lambda: opener(file.path, "rb"), scan.cut)
        if scan.chars <= MAX_DOCUMENT_CHARS:  # held whole: small enough
            yield from self._documents("".join(texts), file.rel, file.path)
        else:
            yield from self._parts(split_text_stream(texts), scan.chars, file.rel, file.path)

    def _read_text(self, file: SourceFile, raw: bytes, cut: bool = False) -> Iterator[Document]:
        """`cut`: `raw` is the start of a file cut off, whose last character may be cut too
        (left out), counted `unreadable_rest_of_file`."""
        utf16 = raw.startswith((b"\xff\xfe", b"\xfe\xff"))  # its byte-order mark
        if b"\x00" in raw and not utf16:
            self._count("skipped/binary")
            return
        try:  # UTF-8's leading byte-order mark is not text either
            decoder = codecs.getincrementaldecoder("utf-16" if utf16 else "utf-8-sig")()
            text = decoder.decode(raw, final=not cut)
        except UnicodeDecodeError as e:
            if not utf16:  # one stray byte costs the whole file: name the line it is on
                bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
                offset = bom + e.start  # the decoder counts from after the byte-order mark
                self._where = ("line", raw.count(b"\n", 0, offset) + 1)
            self._count("skipped/non_utf8")
            self._where = None
            return
        del raw  # not held beside its text while the documents go downstream
        if "\x00" in text:  # UTF-32 (FF FE 00 00), or binary that starts like UTF-16
            self._count("skipped/binary")
            return
        if cut:  # named at the line where it was cut, as a cut .jsonl.gz is
            self._where = ("line", text.count("\n") + 1)
            self._count("skipped/unreadable_rest_of_file")
            self._where = None
            if not text.strip():  # cut before any text: nothing is kept, and it is not `empty`
                return
        yield from self._documents(text, file.rel, file.path)

    def _record_text(self, record: object) -> str | None:
        text = record.get(self.text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            # the fields it has instead: the user may only need to set data.text_field
            is_object = isinstance(record, dict)
            note_fields(self._count("skipped/no_text"), record if is_object else (),
                        has_field=is_object and self.text_field in record, value=text)
            return None
        return text

    def _read_jsonl(self, file: SourceFile) -> Iterator[Document]:
        with _opener(file.path.name.lower())(file.path, "rb") as f:
            yield from self._read_lines(file, f)

    def _read_lines(self, file: SourceFile, f: Iterable[bytes]) -> Iterator[Document]:
        """JSON lines, one record each; a bad line is counted, not the rest of the file."""
        records = 0
        lines = enumerate(f, start=1)
        while True:
            try:
                line_no, line = next(lines)
            except StopIteration:
                break
            except DAMAGED as e:  # a cut-off or damaged .gz / .bz2 / .xz / .zst
                if self._where is None and not isinstance(e, EOFError):
                    raise  # not compressed as its name says: `unreadable`, not cut off
                self._where = ("line", self._where[1] + 1 if self._where else 1)
                self._count("skipped/unreadable_rest_of_file")  # keeps what came before
                return
            self._where = ("line", line_no)
            if not line.strip():
                continue
            records += 1
            try:
                record = json.loads(line.decode("utf-8-sig"))  # BOM-led files too
                if deeper_than(line, MAX_JSON_DEPTH):  # a .json's limit: not the recursion's
                    raise NestedTooDeep
            except UnicodeDecodeError:
                self._count("skipped/non_utf8")
                continue
            except (ValueError, RecursionError):  # one bad line (also a 5,000-digit
                self._count("skipped/bad_json")   # number), not the rest of the file
                continue
            yield from self._record_doc(record, f"{file.rel}:{line_no}", file.path)
        if records == 0:
            self._where = None
            self._count("skipped/empty")

    def _record_doc(self, record: object, doc_id: str, path: Path) -> Iterator[Document]:
        text = self._record_text(record)
        if text is not None:
            yield from self._documents(text, doc_id, path, record_fields(record, self.text_field))


def _opener(name: str):
    """How to open a file named `name` (lower case) for reading bytes: by its compressor."""
    return OPENERS.get(Path(name).suffix, open)

