"""Exact and MinHash deduplication built from datatrove's own stages, wired for any executor.

MinHash (datatrove defaults, as in the digest): word 5-gram shingles of normalised text
(datatrove's `simplify_text`: lowercase, punctuation stripped, numbers/diacritics/whitespace
normalised), 14 buckets x 8 hashes, 64-bit hashes -> ~0.72 similarity threshold,
P(match | s=0.8) = 1 - (1 - 0.8^8)^14 ~ 0.92: FineWeb's settings (5-grams, 112 hashes in 14
buckets of 8). Measured through the prepare stage on pairs of known Jaccard similarity J
(tests/test_dedup.py, 150 pairs each): one copy removed in 0.067 of pairs at J = 0.5
(promised 0.055), 0.953 at J = 0.8 (0.920), 1.0 at J = 0.9. The normalisation folds every
number (a run of digits, with one decimal separator) to `0`, as datatrove's default does:
`x1` and `x2` are one word, and texts that differ only in their numbers are one text. On the
standard library that removes 59 files where not folding removes 56 (the codec tables of
`encodings/` cluster either way). A document of fewer words than an n-gram (a
title, a one-line post, a text in a script written without spaces) has its whole word
sequence as its one shingle (`MinhashSignature`): datatrove gives it no signature, which
would keep every copy. Stages: signature (tasks = input tasks) -> buckets (tasks =
num_buckets) -> cluster (1 task) -> filter (tasks = input tasks, same input).

Exact: datatrove 0.10 ships `ExactDedupSignature -> ExactFindDedups -> ExactDedupFilter` (no
external tool, unlike exact-substring); we hash the document text (or its whitespace/case
normalised form).

Offline choices: the hash is sha1 (datatrove's other built-in, the one FineWeb used) because the
default xxhash is not installed; words are split on whitespace after `simplify_text` (which has
already removed punctuation), not by datatrove's English word tokenizer (spaCy): on 900 kB of
normalised stdlib docstrings and Python docs the two give 148,607 and 148,731 words (spaCy
splits a few stray symbols such as `‘` and `°` off), in 0.015 s against 4.05 s.

Which copy survives: the copy first in read order (the source listing, then the order in the
file), whatever the task count. MinHash: one per cluster, the member first in read order
(kiln.data.minhash_first; datatrove's cluster step keeps the union-find root, which depends on
the task ids and the cluster sizes). Exact: kiln.data.exact_first (datatrove's own finder keeps
the copy first in its own task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup import (
    ExactDedupConfig,
    ExactDedupFilter,
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.utils.hashing import HashConfig
from datatrove.utils.text import simplify_text
from datatrove.utils.word_tokenizers import WordTokenizer

from kiln.data.exact_first import FirstCopyFindDedups, FirstCopySignature, SourceOrder
from kiln.data.minhash_first import FirstCopyMinhashCluster, RecordReadOrder

# the versions of the stages' rules (kiln.data.stage_rules): bump one with any change to
# what is hashed (its normalisation) or which copy stays: dedup_exact's
EXACT_RULES_VERSION = "2026-12-07"
# the shingles, their normalisation, the buckets, which copy stays: dedup_minhash's
MINHASH_RULES_VERSION = "2026-12-07"

DEFAULT_HASH = HashConfig(precision=64, hash_fc="sha1")


class WhitespaceWordTokenizer(WordTokenizer):
    """Split on whitespace; used after datatrove's simplify_text, so punctuation is already gone."""

    def __init__(self):
        super().__init__("whitespace")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        raise NotImplementedError("sentence splitting is not needed for MinHash shingles")

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        raise NotImplementedError("span splitting is not needed for MinHash shingles")


class MinhashSignature(MinhashDedupSignature):
    """datatrove's signature step, with a signature for documents shorter than an n-gram:
    their whole (normalised) word sequence is their one shingle, so copies of a short text
    share a signature and are deduplicated, and different short texts do not collide.
    A document with no word at all (punctuation only) still gets none."""

    def get_shingles(self, text: str) -> np.ndarray:
        shingles = super().get_shingles(text)
        if shingles.size:
            return shingles
        words = self.word_tokenizer.word_tokenize(simplify_text(text, self.config.norm_config))
        if not words:
            return shingles
        return np.array([[self._hash_func(" ".join(words))]], dtype=np.uint64)


def minhash_config(
    n_grams: int = 5, num_buckets: int = 14, hashes_per_bucket: int = 8, seed: int = 1
) -> MinhashConfig:
    return MinhashConfig(
        n_grams=n_grams,
        num_buckets=num_buckets,
        hashes_per_bucket=hashes_per_bucket,
        seed=seed,
        hash_config=DEFAULT_HASH,
    )


@dataclass
class Stage:
    """One executor's worth of work: its pipeline and how many tasks it must run with."""

    name: str
    pipeline: list[PipelineStep]
    tasks: int


def minhash_dedup_stages(
    make_reader: Callable[[], PipelineStep],
    make_writer: Callable[[], PipelineStep],
    work_dir: Path | str,
    tasks: int,
    config: MinhashConfig | None = None,
    exclusion_writer: PipelineStep | None = None,
    order: SourceOrder | None = None,
) -> list[Stage]:
    """The 4 MinHash stages over `work_dir/{signatures,read_order,buckets,remove_ids}`: of
    each cluster the copy first in `order` stays (kiln.data.minhash_first; default: the stdlib
    listing, other documents by source and id).

    make_reader/make_writer return fresh steps (the input is read twice: signature and filter).
    """
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    config = config or minhash_config()
    work = Path(work_dir)
    sigs, order_dir, buckets, remove = (
        str(work / d) for d in ("signatures", "read_order", "buckets", "remove_ids"))
    tok = WhitespaceWordTokenizer()
    order = order if order is not None else SourceOrder(())
    return [
        Stage(
            "minhash_signature",
            [make_reader(), RecordReadOrder(order_dir, order),
             MinhashSignature(sigs, config, language=tok)],
            tasks,
        ),
        Stage(
            "minhash_buckets",
            [MinhashDedupBuckets(sigs, buckets, config=config)],
            config.num_buckets,
        ),
        Stage("minhash_cluster",
              [FirstCopyMinhashCluster(buckets, order_dir, remove, config.num_buckets)], 1),
        Stage(
            "minhash_filter",
            [
                make_reader(),
                MinhashDedupFilter(remove, exclusion_writer=exclusion_writer),
                make_writer(),
            ],
            tasks,
        ),
    ]


def document_text(doc: Document) -> str:
    return doc.text


def normalized_document_text(doc: Document) -> str:
    """Case- and whitespace-insensitive key: 'A  b\\n' and 'a b' are the same document."""
    return " ".join(doc.text.lower().split())


def exact_dedup_stages(
    make_reader: Callable[[], PipelineStep],
    make_writer: Callable[[], PipelineStep],
    work_dir: Path | str,
    tasks: int,
    normalize: bool = False,
    exclusion_writer: PipelineStep | None = None,
    order: SourceOrder | None = None,
) -> list[Stage]:
    """The 3 exact-dedup stages over `work_dir/{exact_first_signatures,exact_first_dups}`:
    signature and finder keep the copy first in `order` (kiln.data.exact_first; default: the
    stdlib listing, other documents by source and id), datatrove's filter drops the others."""
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    getter = normalized_document_text if normalize else document_text
    config = ExactDedupConfig(content_getter=getter, hash_config=DEFAULT_HASH)
    work = Path(work_dir)
    sigs, dups = str(work / "exact_first_signatures"), str(work / "exact_first_dups")
    order = order if order is not None else SourceOrder(())
    return [
        Stage("exact_first_signature", [make_reader(), FirstCopySignature(sigs, config, order)],
              tasks),
        Stage("exact_first_find", [FirstCopyFindDedups(sigs, dups)], 1),
        Stage(
            "exact_filter",
            [
                make_reader(),
                ExactDedupFilter(dups, config, exclusion_writer=exclusion_writer),
                make_writer(),
            ],
            tasks,
        ),
    ]
