"""Exact and MinHash deduplication built from datatrove's own stages, wired for any executor.

MinHash (datatrove defaults, as in the digest): word 5-gram shingles of normalised text
(datatrove's `simplify_text`: lowercase, punctuation stripped, numbers/diacritics/whitespace
normalised), 14 buckets x 8 hashes, 64-bit hashes -> ~0.72 similarity threshold,
P(match | s=0.8) = 1 - (1 - 0.8^8)^14 ~ 0.92. Stages: signature (tasks = input tasks) ->
buckets (tasks = num_buckets) -> cluster (1 task) -> filter (tasks = input tasks, same input).

Exact: datatrove 0.10 ships `ExactDedupSignature -> ExactFindDedups -> ExactDedupFilter` (no
external tool, unlike exact-substring); we hash the document text (or its whitespace/case
normalised form).

Offline choices: the hash is sha1 (datatrove's other built-in, the one FineWeb used) because the
default xxhash is not installed; words are split on whitespace after `simplify_text` (which has
already removed punctuation), because datatrove's English word tokenizer needs spaCy.

Which copy survives. MinHash: the earliest by (task rank, document index). Tasks take input
files round-robin (file i -> rank i % tasks), so its outputs for different task counts agree
when every rank's files precede the next rank's in file order (files <= tasks, or one file per
task). Exact: datatrove orders a hash's copies by (-priority, document index within its task),
not by task, so among copies in different tasks the one with the lowest index in its own task
survives, and which copy that is can change with the task count (the set of texts kept does
not: one copy of each). The same run settings always keep the same copy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup import (
    ExactDedupConfig,
    ExactDedupFilter,
    ExactDedupSignature,
    ExactFindDedups,
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.utils.hashing import HashConfig
from datatrove.utils.word_tokenizers import WordTokenizer

from kiln.atomic import atomic_dir

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
    extra: dict = field(default_factory=dict)


def minhash_dedup_stages(
    make_reader: Callable[[], PipelineStep],
    make_writer: Callable[[], PipelineStep],
    work_dir: Path | str,
    tasks: int,
    config: MinhashConfig | None = None,
    exclusion_writer: PipelineStep | None = None,
) -> list[Stage]:
    """The 4 MinHash stages over `work_dir/{signatures,buckets,remove_ids}`.

    make_reader/make_writer return fresh steps (the input is read twice: signature and filter).
    """
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    config = config or minhash_config()
    work = Path(work_dir)
    sigs, buckets, remove = (str(work / d) for d in ("signatures", "buckets", "remove_ids"))
    tok = WhitespaceWordTokenizer()
    return [
        Stage(
            "minhash_signature",
            [make_reader(), MinhashDedupSignature(sigs, config, language=tok)],
            tasks,
        ),
        Stage(
            "minhash_buckets",
            [MinhashDedupBuckets(sigs, buckets, config=config)],
            config.num_buckets,
        ),
        Stage("minhash_cluster", [MinhashDedupCluster(buckets, remove, config=config)], 1),
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
) -> list[Stage]:
    """datatrove's 3 exact-dedup stages over `work_dir/{exact_signatures,exact_dups}`."""
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    getter = normalized_document_text if normalize else document_text
    config = ExactDedupConfig(content_getter=getter, hash_config=DEFAULT_HASH)
    work = Path(work_dir)
    sigs, dups = str(work / "exact_signatures"), str(work / "exact_dups")
    return [
        Stage(
            "exact_signature",
            [make_reader(), ExactDedupSignature(sigs, config, finder_workers=1)],
            tasks,
        ),
        Stage("exact_find", [ExactFindDedups(sigs, dups, config)], 1),
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


def run_stages_locally(stages: list[Stage], logging_dir: Path | str, workers: int = 1) -> dict:
    """Chain stages with LocalPipelineExecutor `depends` and run them.

    Returns {stage name: {step name: {stat name: total over tasks}}}.
    """
    from datatrove.executor import LocalPipelineExecutor

    if not stages:
        raise ValueError("no stages to run")
    previous = None
    for stage in stages:
        previous = LocalPipelineExecutor(
            stage.pipeline,
            tasks=stage.tasks,
            workers=min(workers, stage.tasks),
            logging_dir=str(Path(logging_dir) / stage.name),
            depends=previous,
            skip_completed=False,
        )
    previous.run()  # launches the chain of dependencies first
    summary = {}
    for stage in stages:
        steps = json.loads((Path(logging_dir) / stage.name / "stats.json").read_text())
        summary[stage.name] = {
            step["name"]: {
                key: int(value["total"] if isinstance(value, dict) else value)
                for key, value in step.get("stats", {}).items()
                if isinstance(value, int | float) or (isinstance(value, dict) and "total" in value)
            }
            for step in steps
        }
    return summary


def jsonl_io(
    input_dir: Path | str, output_dir: Path | str, glob: str = "*.jsonl*"
) -> tuple[Callable[[], PipelineStep], Callable[[], PipelineStep]]:
    """Reader/writer factories for a folder of JSONL(.gz) files (datatrove's Jsonl reader/writer)."""
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    def make_reader() -> PipelineStep:
        return JsonlReader(str(input_dir), glob_pattern=glob, add_file_path=False)

    def make_writer() -> PipelineStep:
        return JsonlWriter(str(output_dir))

    return make_reader, make_writer


def dedup_jsonl(
    input_dir: Path | str,
    output_dir: Path | str,
    work_dir: Path | str,
    tasks: int = 1,
    method: str = "minhash",
    workers: int = 1,
    glob: str = "*.jsonl*",
) -> dict:
    """Deduplicate a folder of JSONL files into output_dir (method "minhash" or "exact").

    work_dir is cleared first (stale signatures from a run with other task counts would mix in);
    output_dir is replaced atomically. Returns the per-stage stat totals.
    """
    if method not in ("minhash", "exact"):
        raise ValueError(f"method must be 'minhash' or 'exact', got {method!r}")
    if not any(Path(input_dir).glob(glob)):
        raise FileNotFoundError(f"no files matching {glob!r} in {input_dir}")
    shutil.rmtree(work_dir, ignore_errors=True)
    with atomic_dir(output_dir) as tmp_out:
        make_reader, make_writer = jsonl_io(input_dir, tmp_out, glob)
        build = minhash_dedup_stages if method == "minhash" else exact_dedup_stages
        stages = build(make_reader, make_writer, work_dir, tasks)
        return run_stages_locally(stages, Path(work_dir) / "logs", workers)
