"""Exact dedup of final texts (digest step 6: MD5 of the cleaned text), after extraction.

Per task only (a set of digests in memory): for a corpus split over many tasks, follow it with
datatrove's cross-task exact or MinHash dedup.
"""

from __future__ import annotations

import hashlib

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep


class ExactTextDedup(PipelineStep):
    """Drop documents whose text was already seen in this task; stats ``duplicate``, ``unique``."""

    type = "🫂 - DEDUP"
    name = "🔥 exact text dedup"

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        seen: set[bytes] = set()
        for doc in data or ():
            digest = hashlib.md5(doc.text.encode("utf-8"), usedforsecurity=False).digest()
            if digest in seen:
                self.stat_update("duplicate")
                continue
            seen.add(digest)
            self.stat_update("unique")
            yield doc
