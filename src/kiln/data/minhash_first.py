"""MinHash dedup that keeps, of each cluster, the copy first in read order, whatever the task count.

datatrove's cluster step keeps the union-find root of each cluster: nodes are (task, index in
task) and unions go by cluster size, so with 1, 2 or 3 tasks a different near-duplicate (its
id, its metadata, its source) survived. Here the signature step also writes each document's
read-order key (`kiln.data.exact_first.SourceOrder`: the source file's place in the listing;
with the index in its task it orders documents as one task reads them) to
`order/NNNNN.order`, 8 bytes a document; the cluster step builds datatrove's clusters, then
keeps each cluster's member of smallest (file key, index) and removes the others.

Memory stays as datatrove's: the cluster step holds its union-find over the documents that
have a near-duplicate, plus one best member per cluster; keys are read by seeking in the
order files, never loaded whole. Its output is datatrove's (`MinhashDedupFilter` reads it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from datatrove.data import DocumentsPipeline
from datatrove.io import DataFolderLike, get_datafolder
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.binaryio import read_tuples_from_file

from kiln.data.exact_first import SourceOrder

ORDER_EXT = ".order"
_KEY = struct.Struct("<Q")


class RecordReadOrder(PipelineStep):
    """Before the signature step: writes each document's file key, in task order, to
    `NNNNN.order` (the document's index in its task is its place in the file), and passes
    the documents on unchanged."""

    type = "🫂 - DEDUPS"
    name = "🎯 MinHash read order"

    def __init__(self, output_folder: DataFolderLike, order: SourceOrder):
        super().__init__()
        self.output_folder = get_datafolder(output_folder)
        self.order = order

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.output_folder.open(f"{rank:05d}{ORDER_EXT}", mode="wb") as f:
            for doc in data:
                f.write(_KEY.pack(self.order.file_key(doc)))
                yield doc


class FirstCopyMinhashCluster(PipelineStep):
    """Stage 3 (one task): datatrove's clusters from the bucket pairs (`*.dups`); each keeps
    its member of smallest (file key, index, task) and the others go to `NNNNNN.remove`."""

    type = "🫂 - DEDUP"
    name = "🎯 MinHash cluster (read order)"

    def __init__(self, input_folder: DataFolderLike, order_folder: DataFolderLike,
                 output_folder: DataFolderLike, num_buckets: int):
        super().__init__()
        self.input_folder = get_datafolder(input_folder)
        self.order_folder = get_datafolder(order_folder)
        self.output_folder = get_datafolder(output_folder)
        self.num_buckets = num_buckets

    def _pairs(self) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        files = self.input_folder.list_files(glob_pattern="*.dups")
        if len(files) % self.num_buckets:
            raise ValueError(f"{len(files)} .dups files for {self.num_buckets} buckets")
        for name in files:
            with self.input_folder.open(name, "rb") as f:
                for f1, d1, f2, d2 in read_tuples_from_file(f, "4I", lines_to_buffer=1024):
                    yield (f1, d1), (f2, d2)

    def _keys(self, nodes: list[tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
        """(file key, index, task) of each node, nodes sorted by (task, index)."""
        task, f = None, None
        try:
            for t, doc in nodes:
                if t != task:
                    if f is not None:
                        f.close()
                    task, f = t, self.order_folder.open(f"{t:05d}{ORDER_EXT}", "rb")
                f.seek(doc * _KEY.size)
                yield _KEY.unpack(f.read(_KEY.size))[0], doc, t
        finally:
            if f is not None:
                f.close()

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"{self.name} runs as one task, not {world_size}")
        parent: dict[tuple[int, int], tuple[int, int]] = {}
        size: dict[tuple[int, int], int] = {}

        def root(x: tuple[int, int]) -> tuple[int, int]:
            path = []
            while parent.setdefault(x, x) != x:
                path.append(x)
                x = parent[x]
            for y in path:  # path compression, iteratively (long chains would recurse deeply)
                parent[y] = x
            return x

        with self.track_time():
            for a, b in self._pairs():
                ra, rb = root(a), root(b)
                if ra != rb:
                    if size.get(ra, 1) < size.get(rb, 1):
                        ra, rb = rb, ra
                    parent[rb] = ra
                    size[ra] = size.get(ra, 1) + size.pop(rb, 1)
            nodes = sorted(parent)
            best: dict[tuple[int, int], tuple[int, int, int]] = {}
            for node, key in zip(nodes, self._keys(nodes)):
                r = root(node)
                if r not in best or key < best[r]:
                    best[r] = key
            with self.output_folder.get_output_file_manager(mode="wb") as out:
                for node in nodes:
                    self.stat_update("duplicates")
                    _, doc, task = best[root(node)]
                    if node != (task, doc):
                        out.write(f"{node[0]:06d}.remove", struct.pack("<I", node[1]))
                        self.stat_update("to_remove")
