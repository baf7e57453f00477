"""Exact dedup that keeps the first copy in read order, whatever the task count.

datatrove's finder orders a hash's copies by (-priority, index within its task), so the copy
kept was the one earliest in *its own task*: with 1, 2 or 3 tasks a different copy (its id,
its metadata, its source) survived. Here each signature carries a global order key, (the
source file's place in the read listing, the document's index in its task): a source file is
read whole by one task, in order, and the handoff between phases keeps that, so the index
orders a file's documents and the file's place orders the files. The kept copy is the one
earliest in the listing (sources in the order given, then path order), as one task keeps it.
A document whose `source` is not in the listing (an injected replica, an arXiv paper) gets a
key from its source and id instead: a fixed place after the listed files.

Memory stays as datatrove's: a task holds its own signatures, the finder merges the sorted
files one record each. Its output is datatrove's (`ExactDedupFilter` reads it unchanged).
"""

from __future__ import annotations

import hashlib
import heapq
import inspect
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.io import DataFolderLike, get_datafolder
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup import ExactDedupConfig
from datatrove.utils.binaryio import read_tuples_from_file
from datatrove.utils.hashing import create_hash_func
from datatrove.utils.typeshelper import ExtensionHelperSD, StatHints

SIG_DTYPE = np.dtype([("hash", "<u8"), ("file", "<u8"), ("doc", "<u4")])
UNLISTED = 1 << 63  # keys of documents whose source is not a listed file start here


class SourceOrder:
    """A document's source file's place in `list_source_files(sources, exclude)`; the listing
    is made in the task that needs it (as the reader makes it), not pickled into every task."""

    def __init__(self, sources: Sequence[str], exclude: Path | None = None):
        self.sources = list(sources)
        self.exclude = exclude
        self._places: dict[str, int] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_places": None}

    def file_key(self, doc: Document) -> int:
        if self._places is None:
            from kiln.data.sources import list_source_files, printable_name

            self._places = {printable_name(str(f.path)): i
                            for i, f in enumerate(list_source_files(self.sources, self.exclude))}
        source = doc.metadata.get("source")
        place = self._places.get(source) if isinstance(source, str) else None
        if place is not None:
            return place
        digest = hashlib.sha1(f"{source}\0{doc.id}".encode("utf-8", "surrogatepass")).digest()
        return UNLISTED | (int.from_bytes(digest[:8], "little") >> 1)


class FirstCopySignature(PipelineStep):
    """Stage 1: (content hash, file key, index in task) of every document, sorted, one file
    per task (`NNNNN.c4_sig`)."""

    type = "🫂 - DEDUPS"
    name = "💥 exact-dedup signature (read order)"

    def __init__(self, output_folder: DataFolderLike, config: ExactDedupConfig,
                 order: SourceOrder):
        super().__init__()
        self.output_folder = get_datafolder(output_folder)
        self.config = config
        self.order = order
        kind = inspect.signature(config.content_getter).return_annotation
        self.hash_fc = create_hash_func(config.hash_config, kind)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        rows = []
        for doc_idx, doc in enumerate(data):
            with self.stats.time_stats:
                self.stat_update(StatHints.total)
                rows.append((self.hash_fc(self.config.content_getter(doc)),
                             self.order.file_key(doc), doc_idx))
        sigs = np.array(rows, dtype=SIG_DTYPE)
        sigs.sort(order=["hash", "file", "doc"])
        with self.output_folder.open(f"{rank:05d}{ExtensionHelperSD.stage_1_signature}",
                                     mode="wb") as f:
            f.write(sigs.tobytes())


def _records(file, task: str) -> Iterator[tuple[int, int, int, str]]:
    with file as f:
        for h, key, doc in read_tuples_from_file(f, "Q", "Q", "I", lines_to_buffer=1024):
            yield h, key, doc, task


class FirstCopyFindDedups(PipelineStep):
    """Stage 2 (one task): merge every task's sorted signatures; of each hash's copies the
    one with the smallest (file key, index) stays, the others are written as datatrove's
    finder writes them (`00000/<task>.c4_dup`, kept copy's count in `.c4_counts`)."""

    type = "🫂 - DEDUPS"
    name = "💥 exact-dedup find (read order)"

    def __init__(self, data_folder: DataFolderLike, output_folder: DataFolderLike):
        super().__init__()
        self.data_folder = get_datafolder(data_folder)
        self.output_folder = get_datafolder(output_folder)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"{self.name} runs as one task, not {world_size}")
        ext = ExtensionHelperSD.stage_1_signature
        names = self.data_folder.list_files(glob_pattern="*" + ext)
        streams = [_records(f, Path(n).name.removesuffix(ext))
                   for n, f in zip(names, self.data_folder.open_files(names))]
        dup, count = struct.Struct("<I"), struct.Struct("<II")
        out = self.output_folder.get_output_file_manager(mode="wb")
        first: tuple[int, int, int, str] | None = None
        copies = 0

        def close_group() -> None:
            if first is not None and copies:
                out.write(f"{rank:05d}/{first[3]}{ExtensionHelperSD.stage_2_counts}",
                          count.pack(first[2], copies))

        with self.stats.time_stats:
            for sig in heapq.merge(*streams):
                if first is not None and sig[0] == first[0]:
                    copies += 1
                    out.write(f"{rank:05d}/{sig[3]}{ExtensionHelperSD.stage_2_duplicates}",
                              dup.pack(sig[2]))
                    continue
                close_group()
                first, copies = sig, 0
            close_group()
        out.close()
