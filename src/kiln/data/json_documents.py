"""The `.json` reader of the `read` stage (kiln.data.documents' SourceReader takes it in):
a file of records read record by record, whole where it fits the free memory, else in a
stream (kiln.data.json_stream); JSONC and any other JSON read as the text they are; a file
too large to hold refused with what to do. Apart from documents.py because a .json's many
shapes make up a reader of their own."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator

from datatrove.data import Document

from kiln.data import json_stream
from kiln.data.json_cursor import JsonStreamError
from kiln.data.json_depth import MAX_JSON_DEPTH, TOO_DEEP, NestedTooDeep, deeper_than
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
)
from kiln.data.json_stream import WHOLE_JSON_BYTES
from kiln.data.json_walk import Members
from kiln.data.jsonc import jsonc_value, strip_jsonc
from kiln.data.skip_examples import MAX_FIELDS, shown_name
from kiln.data.sources import SourceFile, printable_name
from kiln.errors import InputTooLargeError
from kiln.free_memory import host_memory_available


class JsonReading:
    """SourceReader's `.json` methods: they use its counting (`_count`, `_where`, `_key`),
    its text field and its line, text and record readers."""

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
                if deeper_than(raw, MAX_JSON_DEPTH):  # as the stream would find it
                    raise NestedTooDeep
            except (ValueError, RecursionError) as e:  # not UTF-8 or not JSON
                judged = raw
                try:
                    jsonc = jsonc_value(e)  # a tsconfig.json's comments: the JSON it stands for
                except NestedTooDeep as deep:  # judged as the same file without comments
                    judged, e, jsonc = strip_jsonc(e.doc).encode(), deep, None  # type: ignore[attr-defined]
                if jsonc is None:
                    if damaged_records(judged, self._text_key, e):  # never one document of markup
                        if isinstance(e, json.JSONDecodeError):  # where it broke off
                            self._where = ("line", e.lineno)
                        elif isinstance(e, (NestedTooDeep, RecursionError)):
                            self._where = TOO_DEEP
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
            if isinstance(error, JsonStreamError) and error.may_be_jsonc:
                yield from self._read_json_whole(file, opener, budget, free)
            elif starts_as_records(scan.head, self._text_key, scan.cut):
                if isinstance(error, JsonStreamError):  # where it broke off, or how deep
                    self._where = TOO_DEEP if error.recursion else ("line", error.lineno)
                self._count("skipped/bad_json")
            else:  # broken in its middle, not cut off: text, like the source tree
                yield from self._read_text_file(file, opener)
            return
        top = scan.top
        if isinstance(top, Members):
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
