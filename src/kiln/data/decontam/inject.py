"""Controlled contamination: put k replicas of each benchmark item into a corpus, with a manifest.

Follows the contamination study (arXiv:2601.04301): each item is formatted
`Problem: {problem}\n\nSolution: {solution}` and is one document; the corpus is the test set
repeated k times plus web documents filling the *remaining* budget, so total size is the same
for every k (within one web document) when a budget is given. Replicas go to seeded uniformly
random positions among the output slots while web documents keep their order — the same
distribution of replica placement as shuffling everything, without reordering the corpus.

Size is counted in *tokens* in the study (Qwen3's: "tokenize the test set, repeat it R times,
fill the remaining budget"). Kiln trains its tokenizer after prepare, so by default it counts
whitespace words (each Han or kana character a word, as decontamination splits them); give a
tokenizer.json (`prepare.inject_replicas.tokenizer`: `TrainingTokens`) to count what
`kiln tokenize` will make of each document, its ids plus the EOS after it. Words are not a
stand-in for tokens here: a LaTeX solution has several times more tokens per word than web
prose, so a word budget grows the corpus's tokens with k (the confound the fixed budget is
there to remove).
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.atomic import write_json_atomic
from kiln.data.decontam.ngram_index import (
    DEFAULT_ANSWER_FIELDS,
    DEFAULT_PROMPT_FIELDS,
    UNSPACED,
    BenchmarkItem,
    load_benchmark_items,
)

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how replicas are made and placed
RULES_VERSION = "2026-12-07"

REPLICA_TEMPLATE = "Problem: {problem}\n\nSolution: {solution}"
# metadata key of an injected replica (its item number): `kiln tokenize` puts such a document
# in train whatever its split hash, so training sees all k replicas and val holds no
# benchmark text (the study trains on every replica and evaluates on the benchmark)
INJECTED_KEY = "injected_item"


def word_count(text: str) -> int:
    """Whitespace words, each Han or kana character one: the decontamination normaliser's
    rule (`ngram_index.UNSPACED`, after NFKC), so a Chinese or Japanese paragraph is not one
    "word" beside an English one's hundred. Punctuation standing alone is a word, as in
    `str.split` ("a , b": 3); ASCII text counts exactly as `str.split` does."""
    if text.isascii():
        return len(text.split())
    rest, unspaced = UNSPACED.subn(" ", unicodedata.normalize("NFKC", text))
    return len(rest.split()) + unspaced


def size_unit(count_tokens: Callable[[str], int]) -> str:
    """What `count_tokens` counts, for the manifest and messages."""
    unit = getattr(count_tokens, "unit", None)
    return unit or ("words" if count_tokens is word_count else "count_tokens")


class TrainingTokens:
    """Tokens `kiln tokenize` makes of a text with the tokenizer.json at `path`: its ids (no
    post-processor tokens, as `kiln tokenize` encodes) plus the EOS written after it.
    Picklable: the tokenizer is loaded in the worker, on first use."""

    unit = "tokens"  # what the manifest says its counts are

    def __init__(self, path: str | Path):
        from kiln.data.filters.engagement import TokenizerLength

        self.length = TokenizerLength(path, add_special_tokens=False)

    def __call__(self, text: str) -> int:
        return self.length(text) + 1


def format_item(item: BenchmarkItem) -> str:
    if item.prompt is None or not item.answers:
        raise ValueError("an injected item needs both a problem (prompt) and a solution (answer)")
    # the worked solution, not a short final answer beside it (MATH: `solution` and `answer`)
    return REPLICA_TEMPLATE.format(problem=item.prompt, solution=max(item.answers, key=len))


class ReplicasPastBudget(ValueError):
    """The replicas alone take more than the size the shard is to keep."""


def inject_replicas(
    corpus_docs: Iterable[Document],
    benchmark_items: Sequence[BenchmarkItem],
    k: int,
    seed: int,
    token_budget: int | None = None,
    count_tokens: Callable[[str], int] = word_count,
    replica_ids: Sequence[int] | None = None,
    id_prefix: str = "replica",
    sizes: Sequence[int] | None = None,
) -> tuple[list[Document], dict]:
    """Return (documents, manifest): k replicas of every item at seeded random positions.

    token_budget: total size to hit; web docs are taken in order until the next one would pass
    `token_budget - k * |test set|` (so the total is short by less than one web doc).
    replica_ids: which of the k * len(items) replicas (numbered item-major) to place here — lets
    datatrove ranks split the replicas; default all.
    sizes: each corpus document's `count_tokens`, where the caller has counted them already.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    texts = [format_item(it) for it in benchmark_items]
    wanted = range(k * len(texts)) if replica_ids is None else replica_ids
    replicas = [(j // k, j % k) for j in wanted] if k else []
    item_tokens = {i: count_tokens(texts[i]) for i in {i for i, _ in replicas}}  # once each
    replica_tokens = sum(item_tokens[i] for i, _ in replicas)
    web, web_tokens, dropped = [], 0, 0
    remaining = None if token_budget is None else token_budget - replica_tokens
    if remaining is not None and remaining < 0:
        raise ReplicasPastBudget(f"{len(replicas)} replicas take {replica_tokens} "
                         f"{size_unit(count_tokens)} > budget {token_budget}")
    for n, doc in enumerate(corpus_docs):
        if dropped:  # past the budget: the rest of the shard goes
            dropped += 1
            continue
        size = count_tokens(doc.text) if sizes is None else sizes[n]  # a tokenizer's is not free
        if remaining is not None and web_tokens + size > remaining:
            dropped += 1
            continue
        web.append(doc)
        web_tokens += size
    total = len(web) + len(replicas)
    rng = random.Random(seed)
    positions = sorted(rng.sample(range(total), len(replicas)))
    order = list(range(len(replicas)))
    rng.shuffle(order)  # which replica lands in which chosen slot
    out: list[Document] = []
    entries = []
    slot_to_replica = dict(zip(positions, order))
    web_iter = iter(web)
    for pos in range(total):
        if pos in slot_to_replica:
            item, rep = replicas[slot_to_replica[pos]]
            doc_id = f"{id_prefix}-{item}-{rep}"
            out.append(Document(text=texts[item], id=doc_id, metadata={INJECTED_KEY: item}))
            entries.append({"position": pos, "id": doc_id, "item": item, "replica": rep})
        else:
            out.append(next(web_iter))
    manifest = {
        "template": REPLICA_TEMPLATE,
        "k": k,
        "seed": seed,
        "items": len(texts),
        "replicas": len(replicas),
        "replica_tokens": replica_tokens,
        "web_docs": len(web),
        "web_tokens": web_tokens,
        "web_docs_dropped": dropped,
        "token_budget": token_budget,
        "entries": entries,
    }
    return out, manifest


class InjectReplicas(PipelineStep):
    """Pipeline form of `inject_replicas` for one benchmark JSONL.

    Replica j of the k * |items| goes to rank j % world_size; each rank seeds with seed * 100003 + rank,
    holds its shard in memory (positions need the shard length) and writes
    `manifest_dir/injection-<rank>.json`. keep_size=True keeps each shard's total size, as
    `count_tokens` counts it (whitespace words unless given `TrainingTokens`; web docs at the
    end of the shard make room), as in the paper's fixed-budget mixing; a task
    with no documents (more tasks than input files) has no size to keep, and its replicas make
    up its shard, so every replica is still placed once.
    """

    type = "🦠 - DECONT"
    name = "🔥 Kiln inject replicas"

    def __init__(
        self,
        benchmark_path: Path | str,
        k: int,
        seed: int,
        manifest_dir: Path | str,
        keep_size: bool = False,
        prompt_fields: Sequence[str] = DEFAULT_PROMPT_FIELDS,
        answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
        count_tokens: Callable[[str], int] = word_count,
    ):
        super().__init__()
        self.items = load_benchmark_items(benchmark_path, prompt_fields, answer_fields)
        if not self.items:  # an empty file (a failed download): the study would inject nothing
            raise ValueError(f"{benchmark_path} holds no items: there is nothing to inject")
        for item in self.items:  # fail now, not inside a worker
            if item.prompt is None or not item.answers:
                missing = (("problem", prompt_fields) if item.prompt is None
                           else ("solution", answer_fields))
                raise ValueError(f"{item.where}: an injected item needs a "
                                 f"{missing[0]}, and none of the fields {list(missing[1])} "
                                 "holds one")
        self.k, self.seed, self.keep_size = k, seed, keep_size
        self.manifest_dir = Path(manifest_dir)
        self.count_tokens = count_tokens

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        shard = list(data) if data else []
        keep = self.keep_size and bool(shard)
        sizes = [self.count_tokens(d.text) for d in shard]  # once each, budget and fill alike
        budget = sum(sizes) if keep else None
        mine = range(rank, self.k * len(self.items), world_size)
        try:
            docs, manifest = inject_replicas(
                shard,
                self.items,
                self.k,
                seed=self.seed * 100_003 + rank,
                token_budget=budget,
                count_tokens=self.count_tokens,
                replica_ids=mine,
                sizes=sizes,
            )
        except ReplicasPastBudget as e:  # the settings, named
            from kiln.errors import RunDataError

            raise RunDataError(
                f"prepare.inject_replicas.keep_size: task {rank}'s documents hold {budget} "
                f"{size_unit(self.count_tokens)}, fewer than its replicas ({e}, k = {self.k}): "
                "lower prepare.inject_replicas.k, run fewer prepare.tasks or give more "
                "documents (keep_size = false adds the replicas to the documents)") from None
        manifest.update(rank=rank, world_size=world_size, base_seed=self.seed, size_kept=keep,
                        size_unit=size_unit(self.count_tokens))
        write_json_atomic(self.manifest_dir / f"injection-{rank:05d}.json", manifest)
        self.stat_update("replicas", value=manifest["replicas"])
        self.stat_update("web_docs_dropped", value=manifest["web_docs_dropped"])
        yield from docs
