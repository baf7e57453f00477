"""Stage factories: `prepare.<stage>` options -> the datatrove steps of each stage module.

Each `<name>_stage(ctx)` is what `kiln.data.prepare_config.STAGES` points at. Factories check
their inputs (files exist, run directories are trained) when the pipeline is built, before any
work is done, and import their stage module only when called. Barrier stages (dedup, perplexity
selection, Brain Rot arms) return a `StagePlan` whose `barrier` the runner turns into executor
phases; a selection's one-task plan step lives beside its selector (kiln.data.filters.selection,
kiln.data.filters.arms), the steps of the others in their stage modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from kiln.data.prepare_config import (
    KILN_JUDGE,
    TEXT_EDITING_STAGES,
    arms_labels,
    decontaminate_pii_types,
    period_bounds,
)
from kiln.data.stage_registry import StageContext, StagePlan
from kiln.errors import ConfigError, KilnError


def _need_file(key: str, path: str) -> str:
    if not Path(path).is_file():
        where = "" if Path(path).is_absolute() else f" (from {Path.cwd()}: {Path(path).absolute()})"
        raise FileNotFoundError(f"prepare.{key}: file not found: {path}{where}")
    return path


def _need_tokenizer(key: str, path: str) -> None:
    """A tokenizers file that loads (it is small): a file of something else would fail in
    every task, after the stages before it ran."""
    from tokenizers import Tokenizer

    _need_file(key, path)
    try:
        Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own Exception for any bad file
        raise ConfigError(f"prepare.{key}: {path} is not a tokenizer.json that `tokenizers` "
                          f"loads ({e})") from None


def _check_device(key: str, device: str, executor: str) -> None:
    """A torch device name that parses, and (local executor: the tasks run on this machine)
    one this machine has, before a task fails to move its model there."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"prepare.{key}: '{device}' is not a torch device ({e})") from None
    backend = {"cuda": torch.cuda, "mps": getattr(torch.backends, "mps", None)}.get(kind)
    if executor == "local" and backend is not None and not backend.is_available():
        raise ConfigError(f"prepare.{key} = '{device}', but this machine has no {kind} device: "
                          "use 'cpu'")


def read_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.documents import SourceReader

    return SourceReader(ctx.sources, max_bytes=ctx.max_bytes, progress=ctx.progress,
                        exclude=ctx.run_dir, text_field=ctx.text_field,
                        examples_dir=ctx.examples_dir)


def _with_current_bytes(writer, document) -> dict:
    """The writer's usual record, with `metadata.bytes` measured again: filters and PII
    redaction edit the text after the reader measured it."""
    document.metadata["bytes"] = len(document.text.encode("utf-8"))
    return writer._default_adapter(document)


# gzip with no time in its header: a task that writes the same documents again (a resumed
# prepare re-runs the unfinished ones) writes the same bytes, so the documents' sha256s in
# prepare.json, and a prepared run's files, do not depend on the second they were written
STABLE_GZIP = "kiln_gzip"


def _stable_gzip(f, **kwargs):
    from gzip import GzipFile

    return GzipFile(fileobj=f, mtime=0, **kwargs)


def _register_stable_gzip() -> None:
    from fsspec.compression import compr, register_compression

    if STABLE_GZIP not in compr:
        register_compression(STABLE_GZIP, _stable_gzip, [])


_register_stable_gzip()  # at import: datatrove's task processes unpickle the writer's adapter
# from this module, so they register it too


def write_stage(ctx: StageContext) -> PipelineStep:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(ctx.run_dir / "documents"), output_filename="${rank}.jsonl.gz",
                       compression=STABLE_GZIP, adapter=_with_current_bytes)


def arxiv_metadata_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.arxiv import ArxivMetadataFilter

    a = ctx.cfg.arxiv
    return ArxivMetadataFilter(_need_file("arxiv.snapshot", a.snapshot), a.categories, a.min_year,
                               a.min_abstract_words, a.limit)


def arxiv_sources_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.arxiv import ArchiveLimits, ArxivSourceReader

    a = ctx.cfg.arxiv
    if not Path(a.source_dir).is_dir():
        raise FileNotFoundError(f"prepare.arxiv.source_dir: folder not found: {a.source_dir}")
    limits = ArchiveLimits(max_member_bytes=a.max_member_bytes, max_total_bytes=a.max_total_bytes,
                           max_ratio=a.max_ratio, max_members=a.max_members)
    return ArxivSourceReader(a.source_dir, limits)


def latex_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.arxiv import LatexToText

    return LatexToText()


def language_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.filters.language import LanguageFilter

    o = ctx.cfg.language
    return LanguageFilter(o.languages, o.mode, o.strip_math, ctx.exclusion_writer())


def quality_stage(ctx: StageContext) -> list[PipelineStep]:
    from kiln.data.filters.quality import quality_filters

    return quality_filters(ctx.cfg.quality.domain, ctx.exclusion_writer)


def pii_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.pii import PIIRedactor

    return PIIRedactor(ctx.cfg.pii.types or None)


def decontaminate_stage(ctx: StageContext) -> StagePlan:
    """Build the n-gram index once (a one-task setup phase), then filter or tag in the stream."""
    from kiln.data.decontam import BuildDecontaminationIndex, DecontaminationFilter, NGramIndex
    from kiln.data.dedup import Stage
    from kiln.errors import RunDataError

    d = ctx.cfg.decontaminate
    paths = [_need_file("decontaminate.benchmarks", p) for p in d.benchmarks]
    pii_types = decontaminate_pii_types(ctx.cfg)
    try:  # before any task runs: a benchmark that can catch nothing is refused
        index = NGramIndex.build(paths, d.n, d.prompt_fields, d.answer_fields, d.include_prompt,
                                 pii_types)
    except ValueError as e:
        raise RunDataError(f"prepare.decontaminate.benchmarks: {e}") from e
    for line in index.uncatchable_warnings():
        print(f"prepare.decontaminate: warning: {line}", file=sys.stderr)
    index_path = ctx.work_dir / "ngram_index.npz"
    build = BuildDecontaminationIndex(paths, index_path, d.n, d.prompt_fields, d.answer_fields,
                                      d.include_prompt, index=index, pii_types=pii_types)
    record = {"mode": d.mode, "n": d.n, "benchmarks": {
        name: {k: index.info[name][k] for k in ("items", "too_short_items")} for name in index.names}}
    return StagePlan(setup=[Stage("ngram_index", [build], 1)],
                     steps=[DecontaminationFilter(index_path, d.mode, ctx.exclusion_writer())],
                     record=record)


def inject_replicas_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.decontam import InjectReplicas
    from kiln.data.decontam.inject import TrainingTokens, word_count
    from kiln.errors import RunDataError

    o = ctx.cfg.inject_replicas
    count = word_count
    if o.tokenizer:
        _need_tokenizer("inject_replicas.tokenizer", o.tokenizer)
        count = TrainingTokens(o.tokenizer)
    try:  # an item it cannot inject is refused before any task runs, naming its line
        return InjectReplicas(_need_file("inject_replicas.benchmark", o.benchmark), o.k, o.seed,
                              ctx.run_dir / "injection", keep_size=o.keep_size,
                              count_tokens=count)
    except ValueError as e:
        raise RunDataError(f"prepare.inject_replicas.benchmark: {e}") from e


def _unused_writer() -> None:
    return None  # the runner puts the stream's next steps where dedup's writer would be


def _split_last(name: str, phases: list) -> tuple[list, list[PipelineStep]]:
    """Helper phases, and the filter steps of the last phase (between its reader and writer)."""
    *helpers, last = phases
    if last.pipeline[-1] is not None:
        raise RuntimeError(f"{name}: unexpected last phase {last.pipeline}")
    return helpers, last.pipeline[1:-1]


def dedup_exact_stage(ctx: StageContext) -> StagePlan:
    from kiln.data.dedup import exact_dedup_stages
    from kiln.data.exact_first import SourceOrder

    def barrier(make_reader, work_dir: Path):  # the copy first in the read stage's listing stays
        phases = exact_dedup_stages(make_reader, _unused_writer, work_dir, ctx.cfg.tasks,
                                    normalize=ctx.cfg.dedup_exact.normalize,
                                    exclusion_writer=ctx.exclusion_writer(),
                                    order=SourceOrder(ctx.sources, ctx.run_dir))
        return _split_last("dedup_exact", phases)

    return StagePlan(barrier=barrier)


def dedup_minhash_stage(ctx: StageContext) -> StagePlan:
    from kiln.data.dedup import minhash_config, minhash_dedup_stages
    from kiln.data.exact_first import SourceOrder

    m = ctx.cfg.dedup_minhash
    config = minhash_config(m.n_grams, m.num_buckets, m.hashes_per_bucket, m.seed)

    def barrier(make_reader, work_dir: Path):  # of a cluster, the copy first in read order stays
        phases = minhash_dedup_stages(make_reader, _unused_writer, work_dir, ctx.cfg.tasks,
                                      config, exclusion_writer=ctx.exclusion_writer(),
                                      order=SourceOrder(ctx.sources, ctx.run_dir))
        return _split_last("dedup_minhash", phases)

    return StagePlan(barrier=barrier)


def brain_rot_m1_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.filters import EngagementFilter

    o = ctx.cfg.brain_rot_m1
    _need_tokenizer("brain_rot_m1.tokenizer", o.tokenizer)
    return EngagementFilter(o.tokenizer, o.mode,
                            o.popularity_keys, o.junk_max_tokens, o.control_min_tokens,
                            o.popularity_threshold, exclusion_writer=ctx.exclusion_writer())


def brain_rot_m2_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.filters import HeuristicJudge, KilnLabelJudge, SemanticQualityFilter

    o = ctx.cfg.brain_rot_m2
    try:  # a prompt the judge's model cannot hold is refused here, not in a task
        judge = (HeuristicJudge() if o.judge == "heuristic"
                 else KilnLabelJudge(o.judge[len(KILN_JUDGE):]))
    except ValueError as e:
        if isinstance(e, KilnError):  # the run's own config or data, already named
            raise
        raise ConfigError(f"prepare.brain_rot_m2.judge = '{o.judge}': {e}") from None
    return SemanticQualityFilter(judge, o.threshold, o.mode,
                                 exclusion_writer=ctx.exclusion_writer())


def perplexity_stage(ctx: StageContext) -> PipelineStep:
    """The scoring pass: `ppl`, `nll`, `ppl_tokens` in metadata (selection is a later stage)."""
    from kiln.data.filters import PerplexityScorer

    p = ctx.cfg.perplexity
    _check_device("perplexity.device", p.device, ctx.cfg.executor)
    try:  # the scorer checks max_tokens_per_doc against its model's context (no weights)
        return PerplexityScorer(p.run_dir, p.batch_size, p.max_tokens_per_doc or None, p.device)
    except ValueError as e:
        if isinstance(e, KilnError):  # the run's own config or data, already named
            raise
        raise ConfigError(f"prepare.perplexity.{e} (the scoring model: {p.run_dir})") from None


def perplexity_select_stage(ctx: StageContext) -> StagePlan:
    """Keep documents by the stored `ppl`: thresholds from every score (one task), then filter."""
    from kiln.data.dedup import Stage
    from kiln.data.filters.selection import PerplexityThresholds, StoredThresholdSelector

    p = ctx.cfg.perplexity

    def barrier(make_reader, work_dir: Path):
        out = work_dir / "thresholds.json"
        step = PerplexityThresholds(p.mode, p.fraction, p.low_q, p.high_q, out, count=p.count)
        return ([Stage("thresholds", [make_reader(), step], 1)],
                [StoredThresholdSelector(p.mode, out, ctx.exclusion_writer())])

    return StagePlan(barrier=barrier)


def brain_rot_arms_stage(ctx: StageContext) -> StagePlan:
    """Junk / control documents at `ratio` within `budget` tokens: plan (one task), then keep."""
    from kiln.data.dedup import Stage
    from kiln.data.filters.arms import ArmPlanner, ArmSelector

    o = ctx.cfg.brain_rot_arms
    labels = arms_labels(ctx.cfg)
    tokenizer = o.tokenizer
    if labels == "m2":
        _need_tokenizer("brain_rot_arms.tokenizer", tokenizer)
    stages = ctx.cfg.stages
    between = stages[stages.index("brain_rot_m1") + 1:stages.index("brain_rot_arms")] \
        if labels == "m1" else []
    if any(s in TEXT_EDITING_STAGES for s in between):
        # `m1_tokens` counted the texts before they were rewritten (`pii`'s placeholders):
        # the budget counts them again, as written, with M1's tokenizer
        tokenizer = ctx.cfg.brain_rot_m1.tokenizer

    def barrier(make_reader, work_dir: Path):
        out = work_dir / "arms.json"
        step = ArmPlanner(labels, o.ratio, o.budget, o.seed, tokenizer, out)
        return ([Stage("arms_plan", [make_reader(), step], 1)],
                [ArmSelector(labels, o.seed, out, ctx.exclusion_writer())])

    return StagePlan(barrier=barrier, record={"labels": labels, "ratio": o.ratio,
                                              "budget": o.budget, "seed": o.seed})


def gutenberg_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.gutenberg import GutenbergStripper

    return GutenbergStripper(ctx.exclusion_writer(), ctx.sources)


def dating_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.dating import DateDocuments

    return DateDocuments()


def period_stage(ctx: StageContext) -> PipelineStep:
    from kiln.data.dating import CHRONOBERG_PERIODS, PeriodFilter

    o = ctx.cfg.period
    periods = [p if p in CHRONOBERG_PERIODS else period_bounds(p) for p in o.periods]
    return PeriodFilter(periods, o.keep_undated, ctx.exclusion_writer())
