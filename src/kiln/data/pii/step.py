"""PII redaction as a datatrove formatter, so it runs under any datatrove executor."""

from __future__ import annotations

from collections.abc import Iterable

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.formatters.base import BaseFormatter
from datatrove.utils.typeshelper import StatHints

from kiln.data.pii.detect import check_types, redact


class PIIRedactor(BaseFormatter):
    """Replace the six PII types of arXiv:2512.07814 by typed placeholders (IPs by private ones).

    Per document, `doc.metadata["pii"]` gets `{type: count}` for every chosen type (zeros
    included, so the column is present in every row); the step's stats get `pii_<type>` totals
    and `pii_docs_with_<type>`, so a yield report shows how much of each type was scrubbed.
    """

    name = "🔒 Kiln PII redactor"

    def __init__(self, types: Iterable[str] | None = None, metadata_key: str = "pii"):
        super().__init__()
        self.types = check_types(types)
        self.metadata_key = metadata_key
        self._last_counts: dict[str, int] = {}

    def format(self, text: str) -> str:
        redacted, self._last_counts = redact(text, self.types)
        return redacted

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data:
            self.stat_update(StatHints.total)
            with self.track_time():
                doc.text = self.format(doc.text)
            counts = {t: self._last_counts.get(t, 0) for t in self.types}
            doc.metadata[self.metadata_key] = counts
            for pii_type, n in counts.items():
                if n:
                    self.stat_update(f"pii_{pii_type.lower()}", value=n)
                    self.stat_update(f"pii_docs_with_{pii_type.lower()}")
            yield doc
