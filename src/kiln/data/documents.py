"""Raw sources -> datatrove Documents, as a pipeline step, so every executor can run it.

Bad input (non-UTF-8, binary, empty, malformed lines, unreadable files) is counted by reason
and skipped: a yield report is more useful than a crash halfway through a corpus.

The text is the record's `text` field (a parquet file's `text` column), or the one named by
`data.text_field` (`content`, `raw_content` in many datasets). Every field of a record but its
text (a JSON record's keys, a parquet row's other columns) goes into `doc.metadata`, as datatrove's own readers do: later stages judge by it (Brain Rot
M1 by `likes`, `retweets`...; dating by `year`, `date`, `title`, an arXiv `id`...).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import date, time
from pathlib import Path

import orjson
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger
from tqdm import tqdm
from zstandard import ZstdError

from kiln.data import json_stream
from kiln.data.json_records import (
    JSON_MEMORY_FACTOR,
    ListFacts,
    TooLarge,
    damaged_records,
    find_record_lists,
    first_line_object,
    holds_records,
    read_at_most,
    record_lists,
    starts_as_records,
    text_key_pattern,
)
from kiln.data.json_stream import WHOLE_JSON_BYTES
from kiln.data.jsonc import jsonc_value
from kiln.data.long_documents import (
    MAX_DOCUMENT_CHARS,
    PART_OF,
    split_long_text,
    split_text_stream,
)
from kiln.data.prepared import read_documents  # noqa: F401 (read back where it was always imported)
from kiln.data.skip_examples import (
    MAX_FIELDS,
    SkipExamples,
    note_fields,
    shown_name,
    write_task_examples,
)
from kiln.data.sources import (
    NOT_READ_SUFFIXES,
    SourceFile,
    check_sources,
    list_source_files,
    printable_name,
)
from kiln.data.text_files import decoded_chunks, read_head, scan_text
from kiln.data.zstd_files import open_zstd
from kiln.errors import InputTooLargeError
from kiln.free_memory import host_memory_available

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

# Metadata keys the reader sets itself (the pipeline sums `bytes`; `source` names the file;
# `part_of`, on the parts of a cut text, its id): a record's own field of that name is kept as
# `record_<name>`.
KILN_FIELDS = ("source", "bytes", PART_OF)

DEFAULT_TEXT_FIELD = "text"

# Suffixes that are never text; skipped without being read.
BINARY_SUFFIXES = frozenset(
    ".pyc .pyo .so .o .a .dll .exe .bin .pt .npy .npz .png .jpg .jpeg .gif .ico .pdf .zip .gz"
    " .tar .tgz .bz2 .xz .zst .whl .woff .woff2 .ttf .otf .mp3 .mp4 .wav".split()
)


class SourceReader(PipelineStep):
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
            except DAMAGED:  # a cut-off or damaged .gz / .bz2 / .xz / .zst
                self._where = ("line", self._where[1] + 1 if self._where else 1)
                self._count("skipped/unreadable_rest_of_file")  # keeps what came before
                return
            self._where = ("line", line_no)
            if not line.strip():
                continue
            records += 1
            try:
                record = json.loads(line.decode("utf-8-sig"))  # BOM-led files too
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

    def _read_json(self, file: SourceFile, opener=open) -> Iterator[Document]:
        """A .json file of records (kiln.data.json_records): one object with the text field,
        a list of objects, JSON lines, or an object that wraps a list (`{"data": [...]}`,
        read from that list; its key path is noted with each skip). Records without the
        field are each counted `no_text`, with the fields they have, as in JSON lines, not
        the dataset read as one document of markup; an object that wraps several lists
        (`train` and `test`) is not guessed at: counted `several_record_lists`, naming the
        keys. Any other JSON (a package.json, a list of strings) is a text file like the
        rest of a source tree. JSONC (comments, trailing commas) is read as the same file
        without them would be: a tsconfig.json is text, records are records. `opener`
        decompresses a `.json.gz` / `.bz2` / `.xz` / `.zst`. A file over WHOLE_JSON_BYTES,
        or over a quarter of the free memory, is read in a stream, twice
        (kiln.data.json_stream): the same documents and counts, in memory that does not
        grow with it."""
        free = host_memory_available()
        budget = None if free is None else free // JSON_MEMORY_FACTOR
        whole = WHOLE_JSON_BYTES if budget is None else min(WHOLE_JSON_BYTES, budget)
        with opener(file.path, "rb") as f:
            if opener is open:
                small = os.fstat(f.fileno()).st_size <= whole
            else:  # its size is known once it is read
                small = json_stream.holds_at_most(f, whole)
        if small:
            yield from self._read_json_whole(file, opener, budget, free)
        else:
            yield from self._read_json_stream(file, opener, budget, free, whole)

    def _read_json_whole(self, file: SourceFile, opener, budget: int | None,
                         free: int | None) -> Iterator[Document]:
        """Parsed whole; too large for the free memory, it is refused (InputTooLargeError)
        before it is read, not killed midway (what must be held whole: a large one-record
        object or JSONC file)."""
        def read_all() -> bytes:
            with opener(file.path, "rb") as f:
                if opener is not open:  # its size is known once it is read
                    return read_at_most(f, budget)
                if budget is not None and os.fstat(f.fileno()).st_size > budget:
                    raise TooLarge
                return f.read()

        try:
            with opener(file.path, "rb") as f:
                first, more = first_line_object(f, budget)
                if more:  # JSON lines saved as .json: read line by line, as a .jsonl is
                    f.seek(0)
                    yield from self._read_lines(file, f)
                    return
            raw = None if first is not None else read_all()
        except TooLarge:
            raise InputTooLargeError(_json_too_large(file, free, opener is not open)) from None
        if first is not None:  # one object on one line: parsed already
            data = first
        else:  # read once, where the file is not one object on one line
            try:
                data = json.loads(raw.decode("utf-8-sig"))
            except (ValueError, RecursionError) as e:  # not UTF-8 or not JSON
                jsonc = jsonc_value(e)  # a tsconfig.json's comments: the JSON it stands for
                if jsonc is None:
                    if damaged_records(raw, self._text_key, e):  # never one document of markup
                        if isinstance(e, json.JSONDecodeError):  # where it broke off
                            self._where = ("line", e.lineno)
                        self._count("skipped/bad_json")
                    else:  # broken in its middle, not cut off: text, like the source tree
                        yield from self._read_text(file, raw)
                    return
                data = jsonc[0]

        def as_text() -> Iterator[Document]:
            if raw is None:  # one object on one line: its bytes fit, as its parse did
                with opener(file.path, "rb") as f:
                    return self._read_text(file, f.read())
            return self._read_text(file, raw)

        yield from self._json_value(file, data, as_text)

    def _json_value(self, file: SourceFile, data: object,
                    as_text: Callable[[], Iterable[Document]]) -> Iterator[Document]:
        """The documents of a .json parsed to `data`; `as_text`: the file's, read as text."""
        if isinstance(data, dict) and self.text_field in data:
            yield from self._record_doc(data, file.rel, file.path)
            return
        found = record_lists(data, self.text_field) if isinstance(data, dict) else \
            [("", data)] if holds_records(data, self.text_field) else []
        if len(found) > 1:
            self._several_lists([(path, len(r)) for path, r in found])
        elif found:
            self._key = shown_name(found[0][0]) if found[0][0] else None
            for i, record in enumerate(found[0][1]):
                self._where = ("record", i)
                yield from self._record_doc(record, f"{file.rel}:{i}", file.path)
        else:
            yield from as_text()

    def _several_lists(self, found: list[tuple[str, int]]) -> None:
        example = self._count("skipped/several_record_lists", sum(n for _, n in found))
        if example is not None:
            example["keys"] = [shown_name(path) for path, _ in found][:MAX_FIELDS]

    def _read_json_stream(self, file: SourceFile, opener, budget: int | None,
                          free: int | None, whole: int) -> Iterator[Document]:
        """A .json too large to parse whole, decided as `_read_json_whole` decides, from a
        walk that keeps only what the rules ask, and its records read in a second walk
        (kiln.data.json_stream). What must be held whole (JSONC, an object that is one
        record) goes to `_read_json_whole`, refused there where it cannot fit, as is a file
        with a value other than a list of records (a string), or an object of members (records
        keyed by id), too large to hold while it is walked."""
        try:
            yield from self._stream_json(file, opener, budget, free, whole)
        except TooLarge:
            raise InputTooLargeError(_json_too_large(file, free, opener is not open)) from None

    def _stream_json(self, file: SourceFile, opener, budget: int | None, free: int | None,
                     whole: int) -> Iterator[Document]:
        def open_file():
            return opener(file.path, "rb")

        try:
            first, more = json_stream.first_line(open_file, self.text_field,
                                                 min(json_stream.LINE_BYTES, whole), budget)
            scan = first if first is not None or more else \
                json_stream.scan(open_file, self.text_field, budget)
        except TooLarge:  # a value, or an object's members, too large to hold while walked:
            # parsed whole as it always was where the file fits, else refused there
            yield from self._read_json_whole(file, opener, budget, free)
            return
        if more:  # JSON lines saved as .json: read line by line, as a .jsonl is
            with open_file() as f:
                yield from self._read_lines(file, f)
            return
        if isinstance(first, dict):  # one object alone on a line short enough to hold
            yield from self._json_value(file, first, lambda: self._read_text_file(file, opener))
            return
        error = scan.error
        if error is not None:
            if isinstance(error, json_stream.JsonStreamError) and error.may_be_jsonc:
                yield from self._read_json_whole(file, opener, budget, free)
            elif starts_as_records(scan.head, self._text_key, scan.cut):
                if isinstance(error, json_stream.JsonStreamError) and not error.recursion:
                    self._where = ("line", error.lineno)  # where it broke off
                self._count("skipped/bad_json")
            else:  # broken in its middle, not cut off: text, like the source tree
                yield from self._read_text_file(file, opener)
            return
        top = scan.top
        if isinstance(top, json_stream.Members):
            if self.text_field in top:  # one record: held whole, as its document is
                yield from self._read_json_whole(file, opener, budget, free)
                return
            found = list(find_record_lists(
                top, lambda v: v if isinstance(v, ListFacts) else None))
        else:
            found = [("", (), top)] if isinstance(top, ListFacts) and top.records else []
        if len(found) > 1:
            self._several_lists([(path, facts.entries) for path, _, facts in found])
        elif found:
            path, keys, _ = found[0]
            self._key = shown_name(path) if path else None
            route, node = [], top
            for key in keys:
                node = node[key]
                route.append(node.ordinal)
            for i, record in json_stream.entries(open_file, self.text_field, tuple(route),
                                                 scan.start, budget):
                self._where = ("record", i)
                yield from self._record_doc(record, f"{file.rel}:{i}", file.path)
        else:
            yield from self._read_text_file(file, opener)

    def _read_parquet(self, file: SourceFile) -> Iterator[Document]:
        import pyarrow.parquet as pq

        if file.path.stat().st_size == 0:  # no footer to read, but nothing damaged either
            self._count("skipped/empty")
            return
        table = pq.ParquetFile(file.path)  # an unreadable footer: the file is `unreadable`
        if self.text_field not in table.schema_arrow.names:
            # each row is a record lost, as a .jsonl's lines without the field are: one count
            # for a file of a million rows made the yield's kept fraction look whole
            rows = max(1, table.metadata.num_rows)
            note_fields(self._count("skipped/no_text_column", rows), table.schema_arrow.names,
                        has_field=False)
            return
        if table.metadata.num_rows == 0:
            self._count("skipped/empty")
            return
        row = 0
        for group in range(table.num_row_groups):
            yield from self._read_row_group(table, group, file, row)
            row += table.metadata.row_group(group).num_rows

    def _read_row_group(self, table, group: int, file: SourceFile,
                        row: int) -> Iterator[Document]:
        """One row group: damage there (a corrupt page) loses its unread rows, counted as
        `unreadable_rows`, and not the groups after it."""
        import pyarrow as pa

        batches = table.iter_batches(batch_size=1024, row_groups=[group])
        done = 0
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError, ValueError, EOFError):
                self._where = ("row", row + done)  # the first row lost
                self._count("skipped/unreadable_rows",
                            table.metadata.row_group(group).num_rows - done)
                return
            yield from self._read_batch(batch, file, row + done)
            done += batch.num_rows

    def _read_batch(self, batch, file: SourceFile, row: int) -> Iterator[Document]:
        names = [n for n in batch.schema.names if n != self.text_field]
        columns = [self._column_values(batch.column(n)) for n in names]
        rows = zip(*columns) if names else ([] for _ in range(batch.num_rows))
        texts = _as_bytes(batch.column(self.text_field)).to_pylist()
        for i, (text, values) in enumerate(zip(texts, rows, strict=True)):
            self._where = ("row", row + i)
            if isinstance(text, bytes):  # a binary column of UTF-8 text
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError:
                    self._count("skipped/non_utf8")
                    continue
            if not isinstance(text, str):  # a null: the column is there
                note_fields(self._count("skipped/no_text"), batch.schema.names, has_field=True,
                            value=text)
            else:
                yield from self._documents(text, f"{file.rel}:{row + i}", file.path,
                                           record_fields(dict(zip(names, values)),
                                                         self.text_field))

    def _column_values(self, column) -> list:
        """A metadata column as Python values. Dates and times become ISO strings (dating
        reads a `date` string). Invalid UTF-8 in a string column is replaced (U+FFFD, counted
        `fields/replaced_non_utf8`): a field is not worth its document, and pyarrow would fail
        the whole batch. A nested value (a list of strings) holding it becomes None, counted
        `fields/dropped_non_utf8`."""
        try:
            values = column.to_pylist()
        except UnicodeDecodeError:
            values = self._decoded_values(column)
        return [v.isoformat() if isinstance(v, date | time) else v for v in values]

    def _decoded_values(self, column) -> list:
        raw = _as_bytes(column)
        if raw is not column:  # a string column, as bytes: decoded row by row
            return [None if v is None else self._decode(v) for v in raw.to_pylist()]
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except UnicodeDecodeError:
                self._count("fields/dropped_non_utf8")
                values.append(None)
        return values

    def _decode(self, value: bytes) -> str:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            self._count("fields/replaced_non_utf8")
            return value.decode("utf-8", "replace")


def _json_too_large(file: SourceFile, free: int | None, compressed: bool = False) -> str:
    """What to do with a .json too large to parse whole here: a list of records, wrapped or
    not, is read in a stream, so this is one record (an object with the text field), JSON
    with comments, or a value too large to hold. `compressed`: its size on disk says nothing
    of its parse (a 1 GB .json.gz may hold 10 GB), and jq reads it decompressed."""
    size, free_gb = file.path.stat().st_size / 1e9, (free or 0) / 1e9
    if compressed:
        which = (f"this one decompresses to over {free_gb / JSON_MEMORY_FACTOR:.2f} GB "
                 f"({size:.2f} GB compressed), more than this machine's {free_gb:.2f} GB free "
                 "can hold")
        jq = "e.g. zcat (or xzcat, bzcat, zstdcat) FILE | jq -c . > FILE.jsonl"
    else:
        which = (f"this one ({size:.2f} GB on disk) is more than this machine's "
                 f"{free_gb:.2f} GB free can hold")
        jq = "e.g. jq -c . FILE > FILE.jsonl"
    return (f"{printable_name(str(file.path))}: a .json is parsed whole where it is one record "
            "(an object with the text field) or has comments (JSONC), and a value in it other "
            "than a list of records (a string, a record) is held whole, which takes about "
            f"{JSON_MEMORY_FACTOR}x its size in memory; {which}; save it without comments as "
            f"JSON lines (.jsonl: read a line at a time, at any size), {jq} (a list of "
            "records, or one in an object, is read a record at a time at any size)")


def _opener(name: str):
    """How to open a file named `name` (lower case) for reading bytes: by its compressor."""
    return OPENERS.get(Path(name).suffix, open)


def record_fields(record: dict, text_field: str = DEFAULT_TEXT_FIELD) -> dict:
    """A record's metadata: every field but its text, a nested `metadata` object merged in
    (top-level fields win, as in datatrove's readers), Kiln's own keys renamed `record_<key>`."""
    fields = {k: v for k, v in record.items() if k != text_field}
    if isinstance(fields.get("metadata"), dict):
        fields = fields.pop("metadata") | fields
    for key in KILN_FIELDS:
        if key in fields:
            new = f"record_{key}"
            while new in fields:  # a record with `source` and `record_source` keeps both
                new = f"record_{new}"
            fields[new] = fields.pop(key)
    return fields


def _as_bytes(column):
    """A string column as the bytes it holds (no copy): pyarrow decodes a whole batch at
    once, so one row of invalid UTF-8 (writers rarely check) would lose the batch and the
    rest of the file; decoded row by row, it is one `non_utf8` row."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):  # the values, row by row (a take: no decoding)
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_string(kind):
        return column.cast(pa.binary())
    if pa.types.is_large_string(kind):
        return column.cast(pa.large_binary())
    if getattr(pa.types, "is_string_view", lambda t: False)(kind):
        return column.cast(pa.binary_view())
    return column
