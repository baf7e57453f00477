"""A record's metadata as the `read` stage keeps it: every field but its text, Kiln's own
keys renamed. Shared by the JSON, JSON lines and parquet readers."""

from __future__ import annotations

from kiln.data.long_documents import PART_OF

# Metadata keys the reader sets itself (the pipeline sums `bytes`; `source` names the file;
# `part_of`, on the parts of a cut text, its id): a record's own field of that name is kept as
# `record_<name>`.
KILN_FIELDS = ("source", "bytes", PART_OF)

DEFAULT_TEXT_FIELD = "text"


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
