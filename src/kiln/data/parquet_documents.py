"""The `.parquet` reader of the `read` stage (kiln.data.documents' SourceReader takes it in):
row group by row group, a damaged group losing only its own rows, invalid UTF-8 costing a
row or a field rather than the batch. Apart from documents.py because pyarrow's columns and
their decoding are a reader of their own."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, time

from datatrove.data import Document

from kiln.data.record_fields import record_fields
from kiln.data.skip_examples import note_fields
from kiln.data.sources import SourceFile


class ParquetReading:
    """SourceReader's `.parquet` methods: they use its counting (`_count`, `_where`), its text
    field and its `_documents`."""

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
