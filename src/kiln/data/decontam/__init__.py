"""Benchmark decontamination (n-gram index + filter) and its inverse, controlled injection."""

from kiln.data.decontam.filter import (
    BENCHMARKS_KEY,
    MATCHES_KEY,
    BuildDecontaminationIndex,
    DecontaminationFilter,
)
from kiln.data.decontam.inject import (
    INJECTED_KEY,
    REPLICA_TEMPLATE,
    InjectReplicas,
    format_item,
    inject_replicas,
)
from kiln.data.decontam.ngram_index import (
    BenchmarkItem,
    NGramIndex,
    load_benchmark_items,
    normalize_tokens,
)

__all__ = [
    "BENCHMARKS_KEY",
    "INJECTED_KEY",
    "MATCHES_KEY",
    "REPLICA_TEMPLATE",
    "BenchmarkItem",
    "BuildDecontaminationIndex",
    "DecontaminationFilter",
    "InjectReplicas",
    "NGramIndex",
    "format_item",
    "inject_replicas",
    "load_benchmark_items",
    "normalize_tokens",
]
