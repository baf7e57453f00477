"""MinHash dedup that keeps, of each cluster, the copy first in read order, whatever the task count.

datatrove's cluster step keeps the union-find root of each cluster: nodes are (task, index in
task) and unions go by cluster size, so with 1, 2 or 3 tasks a different near-duplicate (its
id, its metadata, its source) survived. Here the signature step also writes each document's
read-order key (`kiln.data.exact_first.SourceOrder`: the source file's place in the listing;
with the index in its task it orders documents as one task reads them) to
`order/NNNNN.order`, 8 bytes a document; the cluster step builds datatrove's clusters, then
keeps each cluster's member of smallest (file key, index) and removes the others.

Memory stays within datatrove's: the cluster step holds its union-find over the documents
that have a near-duplicate (one int a node, not a tuple), then a few 8-byte arrays over those
nodes; keys are read in blocks from the order files, never loaded whole. Its output is
datatrove's (`MinhashDedupFilter` reads it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
from datatrove.data import DocumentsPipeline
from datatrove.io import DataFolderLike, get_datafolder
from datatrove.pipeline.base import PipelineStep

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
    its member of smallest (file key, index, task) and the others go to `NNNNNN.remove`.

    A node is one int, task << 32 | index (hashed and sorted faster than datatrove's tuples,
    and smaller); pairs are read in blocks with numpy. After the unions, the nodes, their
    roots and their keys are arrays: keys are read from the order files in sorted blocks
    (one read a block of `KEY_BLOCK` keys holding a duplicate, not one seek a duplicate), the
    best member of each cluster found by one sort, and each task's removals written at once."""

    type = "🫂 - DEDUP"
    name = "🎯 MinHash cluster (read order)"

    PAIR_BLOCK = 1 << 16  # pairs read at a time (1 MiB)
    KEY_BLOCK = 1 << 16  # keys read at a time (512 KiB)

    def __init__(self, input_folder: DataFolderLike, order_folder: DataFolderLike,
                 output_folder: DataFolderLike, num_buckets: int):
        super().__init__()
        self.input_folder = get_datafolder(input_folder)
        self.order_folder = get_datafolder(order_folder)
        self.output_folder = get_datafolder(output_folder)
        self.num_buckets = num_buckets

    def _pairs(self) -> Iterator[tuple[list[int], list[int]]]:
        """The bucket pairs, a block at a time: (first nodes, second nodes)."""
        files = self.input_folder.list_files(glob_pattern="*.dups")
        if len(files) % self.num_buckets:
            raise ValueError(f"{len(files)} .dups files for {self.num_buckets} buckets")
        for name in files:
            with self.input_folder.open(name, "rb") as f:
                while chunk := f.read(self.PAIR_BLOCK * 16):
                    if len(chunk) % 16:
                        raise ValueError(f"{name}: {len(chunk) % 16} bytes past its last pair")
                    rows = np.frombuffer(chunk, "<u4").reshape(-1, 4).astype(np.uint64)
                    yield ((rows[:, 0] << 32 | rows[:, 1]).tolist(),
                           (rows[:, 2] << 32 | rows[:, 3]).tolist())

    def _keys(self, task: int, docs: np.ndarray) -> np.ndarray:
        """The read-order keys of task `task`'s documents `docs` (sorted)."""
        keys = np.empty(len(docs), np.uint64)
        block = docs // self.KEY_BLOCK
        starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
        name = f"{task:05d}{ORDER_EXT}"
        with self.order_folder.open(name, "rb") as f:
            for s, e in zip(starts.tolist(), [*starts[1:].tolist(), len(docs)]):
                first = int(block[s]) * self.KEY_BLOCK
                f.seek(first * _KEY.size)
                have = np.frombuffer(f.read(self.KEY_BLOCK * _KEY.size), "<u8")
                at = docs[s:e] - first
                if int(at[-1]) >= len(have):
                    raise ValueError(f"{name} has no key for document {int(docs[e - 1])}")
                keys[s:e] = have[at]
        return keys

    def _remove_later_copies(self, parent: dict[int, int]) -> None:
        """Writes `NNNNNN.remove`: each node of `parent` (node -> its root; emptied here) but
        its cluster's member of smallest (key, index, task)."""
        node = np.fromiter(parent.keys(), np.uint64, len(parent))
        roots = np.fromiter(parent.values(), np.uint64, len(parent))
        parent.clear()
        by = np.argsort(node)
        node, roots = node[by], roots[by]
        del by
        task = (node >> np.uint64(32)).astype(np.int64)
        doc = (node & np.uint64(0xFFFFFFFF)).astype(np.int64)
        del node
        keys = np.empty(len(doc), np.uint64)
        tasks, starts = np.unique(task, return_index=True)
        ends = [*starts[1:].tolist(), len(doc)]
        for t, s, e in zip(tasks.tolist(), starts.tolist(), ends):
            keys[s:e] = self._keys(t, doc[s:e])
        # of each cluster (same root) the member of smallest (key, index, task) stays
        best = np.lexsort((task, doc, keys, roots))
        first = best[np.r_[True, roots[best[1:]] != roots[best[:-1]]]]
        gone = np.ones(len(doc), bool)
        gone[first] = False
        del best, first, keys, roots
        self.stat_update("duplicates", value=len(doc))
        if gone.any():
            self.stat_update("to_remove", value=int(gone.sum()))
        for t, s, e in zip(tasks.tolist(), starts.tolist(), ends):
            out = doc[s:e][gone[s:e]]
            if len(out):
                with self.output_folder.open(f"{t:06d}.remove", "wb") as f:
                    f.write(out.astype("<u4").tobytes())

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"{self.name} runs as one task, not {world_size}")
        parent: dict[int, int] = {}
        size: dict[int, int] = {}

        def root(x: int) -> int:
            p = parent.setdefault(x, x)
            if p == x:
                return x
            path = [x]
            while (q := parent[p]) != p:
                path.append(p)
                p = q
            for y in path:  # path compression, iteratively (long chains would recurse deeply)
                parent[y] = p
            return p

        with self.track_time():
            for firsts, seconds in self._pairs():
                for a, b in zip(firsts, seconds):
                    ra, rb = root(a), root(b)
                    if ra != rb:
                        if size.get(ra, 1) < size.get(rb, 1):
                            ra, rb = rb, ra
                        parent[rb] = ra
                        size[ra] = size.get(ra, 1) + size.pop(rb, 1)
            size.clear()
            if not parent:
                return
            for x in parent:  # every node's parent its root (no node is added)
                root(x)
            self._remove_later_copies(parent)
