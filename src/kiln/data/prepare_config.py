"""The `[prepare]` config: stage list, executor, and typed options per stage; checked at load time.

Kept free of heavy imports (no datatrove, torch or spaCy), so `import kiln.config` stays cheap:
the stage factories in `kiln.data.stages` import what they need only when a pipeline is built.
Per-stage options are sub-tables (`[prepare.quality]`, `[prepare.decontaminate]`...); an unknown
key fails with the closest valid one (kiln.config's loader), and `validate_prepare` rejects
impossible combinations naming the key, before any work is done.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field

from kiln.errors import ConfigError

EXECUTORS = ("local", "slurm", "ray")
# exact dedup of the final text (the arXiv digest): two files that differ only in what PII
# redaction replaces are one document after it
DEFAULT_STAGES = ["read", "quality", "pii", "dedup_exact", "write"]
QUICKSTART_STAGES = DEFAULT_STAGES  # + "decontaminate" before "write" when benchmarks are given
ARXIV_STAGES = [
    "arxiv_metadata", "arxiv_sources", "latex", "quality", "pii", "dedup_exact",
    "decontaminate", "write",
]
# Copies of constants that live next to heavy imports; tests assert they stay equal.
QUALITY_DOMAINS = ("prose", "latex", "code")  # kiln.data.filters.quality.DOMAINS
PII_TYPE_NAMES = ("KEY", "USERNAME", "EMAIL", "PASSWORD", "NAME", "IP_ADDRESS")  # pii.spans
ARXIV_CATEGORIES = ("math", "cs", "hep-th", "hep-ph", "quant-ph", "stat.ML", "stat.TH")
SELECTION_MODES = ("top_fraction", "bottom_fraction", "drop_extremes")  # filters.selection
PERIOD = re.compile(r"^(\d{3,4})-(\d{3,4})$")  # Chronoberg bucket names have this form too


@dataclass
class QualityOptions:
    # the default corpus is the Python standard library, hence "code"; use "prose" for web text
    domain: str = "code"  # prose | latex | code


@dataclass
class PIIOptions:
    types: list[str] = field(default_factory=list)  # empty: all six types of the PII paper


@dataclass
class DecontaminateOptions:
    benchmarks: list[str] = field(default_factory=list)  # JSON lines (.gz too) or a .json list (name = stem; same stems: with folders)
    n: int = 13  # words per n-gram (datatrove: 12; why 13: kiln.data.decontam.ngram_index)
    mode: str = "drop"  # drop | tag (keep, with the matched benchmarks in metadata)
    prompt_fields: list[str] = field(default_factory=lambda: ["prompt", "question", "input",
                                                               "problem"])
    answer_fields: list[str] = field(default_factory=lambda: ["answer", "answers", "output",
                                                               "target", "solution"])
    include_prompt: bool = True  # prompt-only n-grams count too (a leaked problem statement)


@dataclass
class InjectOptions:
    benchmark: str = ""  # benchmark file (as decontaminate reads) of problems/solutions to inject (controlled contamination)
    k: int = 1  # replicas of every item
    seed: int = 0
    keep_size: bool = False  # drop web documents at the end of each shard to keep its size


@dataclass
class DedupExactOptions:
    normalize: bool = False  # compare case- and whitespace-normalised text


@dataclass
class DedupMinhashOptions:
    n_grams: int = 5
    num_buckets: int = 14
    hashes_per_bucket: int = 8
    seed: int = 1


@dataclass
class PerplexityOptions:
    run_dir: str = ""  # a Kiln run directory whose latest checkpoint scores the documents
    mode: str = "top_fraction"  # top_fraction | bottom_fraction | drop_extremes
    fraction: float = 0.0  # top/bottom_fraction: share of scored documents kept (required)
    low_q: float = 0.0  # drop_extremes: keep scores between these quantiles (required)
    high_q: float = 0.0
    batch_size: int = 8
    max_tokens_per_doc: int = 0  # 0: the paper's 512 (or what the model's context holds)
    device: str = "cpu"


@dataclass
class BrainRotM1Options:
    tokenizer: str = ""  # a local tokenizer.json for token lengths (the paper: Llama-3's)
    mode: str = "drop"  # drop | tag
    popularity_keys: list[str] = field(default_factory=lambda: ["likes", "retweets", "replies",
                                                                 "quotes"])
    junk_max_tokens: int = 30
    control_min_tokens: int = 100
    popularity_threshold: int = 500


@dataclass
class BrainRotM2Options:
    judge: str = "heuristic"  # heuristic | kiln:RUN_DIR (a Kiln checkpoint as label judge)
    threshold: float = 0.5  # junk when junk_score >= threshold
    mode: str = "drop"  # drop | tag


@dataclass
class PeriodOptions:
    periods: list[str] = field(default_factory=list)  # "1800-1849" (Chronoberg) or "START-END"
    keep_undated: bool = False


@dataclass
class ArxivOptions:
    snapshot: str = ""  # metadata snapshot, JSON lines (.gz ok)
    source_dir: str = ""  # folder of source archives (flat or by yymm)
    categories: list[str] = field(default_factory=lambda: list(ARXIV_CATEGORIES))
    min_year: int = 1995
    min_abstract_words: int = 20
    limit: int = 0  # papers per task after the metadata filter (0 = all)
    max_member_bytes: int = 5 * 1024 * 1024
    max_total_bytes: int = 200 * 1024 * 1024
    max_ratio: float = 100.0  # refuse archives that expand more than this (past 1 MiB)
    max_members: int = 10_000


@dataclass
class PrepareConfig:
    # ordered stage names (see STAGES); the first reads documents, the last is "write"
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    executor: str = "local"  # local | slurm | ray
    tasks: int = 1  # shards of the input files; each task writes one documents file
    workers: int = 1  # local: tasks run at the same time
    resume: bool = True  # skip tasks a previous run of the same pipeline completed
    keep_rejected: bool = False  # filters write dropped documents to rejected/<stage>/
    # datatrove's task logs on the console too (always in logs/prepare/**/logs/task_*.log)
    console_logs: bool = False
    slurm_partition: str = ""
    slurm_time: str = "04:00:00"
    cpus_per_task: int = 1  # slurm / ray
    mem_per_cpu_gb: int = 2  # slurm / ray
    quality: QualityOptions = field(default_factory=QualityOptions)
    pii: PIIOptions = field(default_factory=PIIOptions)
    decontaminate: DecontaminateOptions = field(default_factory=DecontaminateOptions)
    inject_replicas: InjectOptions = field(default_factory=InjectOptions)
    dedup_exact: DedupExactOptions = field(default_factory=DedupExactOptions)
    dedup_minhash: DedupMinhashOptions = field(default_factory=DedupMinhashOptions)
    perplexity: PerplexityOptions = field(default_factory=PerplexityOptions)
    brain_rot_m1: BrainRotM1Options = field(default_factory=BrainRotM1Options)
    brain_rot_m2: BrainRotM2Options = field(default_factory=BrainRotM2Options)
    period: PeriodOptions = field(default_factory=PeriodOptions)
    arxiv: ArxivOptions = field(default_factory=ArxivOptions)


@dataclass(frozen=True)
class StageSpec:
    """Where a stage's factory lives ("module:function") and whether it reads documents in."""

    target: str
    reader: bool = False


_S = "kiln.data.stages"
STAGES: dict[str, StageSpec] = {
    "read": StageSpec(f"{_S}:read_stage", reader=True),
    "arxiv_metadata": StageSpec(f"{_S}:arxiv_metadata_stage", reader=True),
    "arxiv_sources": StageSpec(f"{_S}:arxiv_sources_stage", reader=True),
    "latex": StageSpec(f"{_S}:latex_stage"),
    "quality": StageSpec(f"{_S}:quality_stage"),
    "brain_rot_m1": StageSpec(f"{_S}:brain_rot_m1_stage"),
    "brain_rot_m2": StageSpec(f"{_S}:brain_rot_m2_stage"),
    "perplexity": StageSpec(f"{_S}:perplexity_stage"),
    "perplexity_select": StageSpec(f"{_S}:perplexity_select_stage"),
    "pii": StageSpec(f"{_S}:pii_stage"),
    "decontaminate": StageSpec(f"{_S}:decontaminate_stage"),
    "inject_replicas": StageSpec(f"{_S}:inject_replicas_stage"),
    "dedup_exact": StageSpec(f"{_S}:dedup_exact_stage"),
    "dedup_minhash": StageSpec(f"{_S}:dedup_minhash_stage"),
    "dating": StageSpec(f"{_S}:dating_stage"),
    "period": StageSpec(f"{_S}:period_stage"),
    "write": StageSpec(f"{_S}:write_stage"),
}

# stage -> stages one of which must come before it (in this list order)
NEEDS_BEFORE = {
    "latex": ("arxiv_sources",),
    "perplexity_select": ("perplexity",),
    "period": ("dating", "arxiv_metadata"),
}
# reader -> the stage whose documents it reads when it is not first (arxiv_sources fetches
# the papers arxiv_metadata kept); any other reader after the first is refused
READS_FROM = {"arxiv_sources": "arxiv_metadata"}
# stage -> the stage that must come after it: arxiv_sources yields raw LaTeX archives (in
# metadata), not document text, until `latex` converts them
NEEDS_AFTER = {
    "arxiv_sources": "latex",
}


# stages whose options live in another stage's table (the others: the table of their name)
OPTION_TABLES = {"perplexity_select": "perplexity", "arxiv_metadata": "arxiv",
                 "arxiv_sources": "arxiv"}


def unused_option_tables(*stage_lists: list[str]) -> set[str]:
    """The option tables (`decontaminate`, `arxiv`...) that no stage of `stage_lists` reads:
    their settings change no data, so a resume or a re-run prepare ignores them."""
    used = {OPTION_TABLES.get(s, s) for stages in stage_lists for s in stages}
    tables = {f.name for f in dataclasses.fields(PrepareConfig)
              if dataclasses.is_dataclass(f.default_factory)}  # type: ignore[arg-type]
    return tables - used


def stage_options(settings: dict) -> dict[str, dict]:
    """{stage: its options table} for the stages `settings` runs (a prepare signature, or
    `dataclasses.asdict` of a PrepareConfig); stages without options are left out."""
    tables = {stage: OPTION_TABLES.get(stage, stage) for stage in settings.get("stages", [])}
    return {stage: settings[t] for stage, t in tables.items() if isinstance(settings.get(t), dict)}


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:  # by letters whatever their case: 'emails' means 'EMAIL'
        lower = {c.lower(): c for c in choices}
        close = difflib.get_close_matches(str(value).lower(), list(lower), n=1)
        hint = f" (did you mean '{lower[close[0]]}'?)" if close else ""
        raise ConfigError(f"prepare.{key}: '{value}' is not one of {list(choices)}{hint}")


def _check_stage_list(cfg: PrepareConfig, making_data: bool) -> None:
    stages = cfg.stages
    if not stages:
        raise ConfigError("prepare.stages is empty; the shortest pipeline is [\"read\", \"write\"]")
    for name in stages:
        if name not in STAGES:
            close = difflib.get_close_matches(name, list(STAGES), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"prepare.stages: unknown stage '{name}'{hint}; known: {sorted(STAGES)}")
    if not STAGES[stages[0]].reader:
        readers = sorted(n for n, s in STAGES.items() if s.reader)
        raise ConfigError(f"prepare.stages must start with a reader stage {readers}, not '{stages[0]}'")
    if making_data:
        _refuse_late_readers(stages)
    if stages[-1] != "write" or stages.count("write") != 1:
        raise ConfigError("prepare.stages must end with 'write' (and name it once)")
    dupes = sorted({n for n in stages if stages.count(n) > 1})
    if dupes:
        raise ConfigError(f"prepare.stages names {dupes} more than once")
    for name, before in NEEDS_BEFORE.items():
        if name in stages and not any(b in stages[: stages.index(name)] for b in before):
            raise ConfigError(f"prepare.stages: '{name}' needs {' or '.join(map(repr, before))} "
                         "before it")
    for name, after in NEEDS_AFTER.items():
        if name in stages and after not in stages[stages.index(name) + 1:]:
            raise ConfigError(f"prepare.stages: '{name}' needs '{after}' after it")


def _refuse_late_readers(stages: list[str]) -> None:
    """One reader per prepare, first: a later one's documents would join the stream unseen
    by the stages before it (and uncounted by prepare.json), but for READS_FROM."""
    for i, name in enumerate(stages[1:], start=1):
        if STAGES[name].reader and READS_FROM.get(name) not in stages[:i]:
            raise ConfigError(
                f"prepare.stages: '{name}' reads documents of its own and must come first"
                + (f" (or after '{READS_FROM[name]}', whose documents it reads)"
                   if name in READS_FROM else "")
                + f", not after '{stages[i - 1]}': its documents would join the stream unseen "
                f"by the stages before it (one reader per prepare: here '{stages[0]}')")


def _check_stage_options(cfg: PrepareConfig) -> None:
    on = set(cfg.stages)
    _choice("quality.domain", cfg.quality.domain, QUALITY_DOMAINS)
    for t in cfg.pii.types:
        _choice("pii.types", t, PII_TYPE_NAMES)
    d = cfg.decontaminate
    _choice("decontaminate.mode", d.mode, ("drop", "tag"))
    if "decontaminate" in on and not d.benchmarks:
        raise ConfigError("prepare.decontaminate.benchmarks is empty: list benchmark JSONL files, "
                     "or remove 'decontaminate' from prepare.stages")
    if d.benchmarks and "decontaminate" not in on:
        raise ConfigError("prepare.decontaminate.benchmarks is set but 'decontaminate' is not in "
                     "prepare.stages: add it before 'write' (or clear the benchmarks)")
    if d.n < 1:
        raise ConfigError(f"prepare.decontaminate.n must be >= 1, got {d.n}")
    _check_inject(cfg, on)
    m = cfg.dedup_minhash
    for key in ("n_grams", "num_buckets", "hashes_per_bucket"):
        if getattr(m, key) < 1:
            raise ConfigError(f"prepare.dedup_minhash.{key} must be >= 1, got {getattr(m, key)}")
    _check_perplexity(cfg, on)
    b1, b2 = cfg.brain_rot_m1, cfg.brain_rot_m2
    _choice("brain_rot_m1.mode", b1.mode, ("drop", "tag"))
    if "brain_rot_m1" in on and not b1.tokenizer:
        raise ConfigError("prepare.brain_rot_m1.tokenizer is empty: give a local tokenizer.json for "
                     "token lengths (the paper counts Llama-3 tokens)")
    if not b1.popularity_keys:
        raise ConfigError("prepare.brain_rot_m1.popularity_keys must name at least one field")
    _choice("brain_rot_m2.mode", b2.mode, ("drop", "tag"))
    if b2.judge != "heuristic" and not (b2.judge.startswith("kiln:") and len(b2.judge) > 5):
        raise ConfigError(f"prepare.brain_rot_m2.judge: '{b2.judge}' is neither 'heuristic' nor "
                     "'kiln:RUN_DIR'")
    if not 0.0 <= b2.threshold <= 1.0:
        raise ConfigError(f"prepare.brain_rot_m2.threshold must be in [0, 1], got {b2.threshold}")
    _check_period(cfg, on)
    a = cfg.arxiv
    if "arxiv_metadata" in on and not a.snapshot:
        raise ConfigError("prepare.arxiv.snapshot is empty: the arXiv metadata snapshot (JSON lines)")
    if "arxiv_sources" in on and not a.source_dir:
        raise ConfigError("prepare.arxiv.source_dir is empty: the folder of source archives")
    if not a.categories:
        raise ConfigError("prepare.arxiv.categories is empty: no paper would be kept")


# stages that would remove injected replicas (all but one copy, or every one) after they are
# put in: the study would not train on the k replicas it reports
UNDO_INJECTION = ("dedup_exact", "dedup_minhash", "decontaminate")


def _check_inject(cfg: PrepareConfig, on: set[str]) -> None:
    o = cfg.inject_replicas
    if "inject_replicas" not in on:
        changed = [f.name for f in dataclasses.fields(o)
                   if getattr(o, f.name) != getattr(InjectOptions(), f.name)]
        if changed:
            raise ConfigError(f"prepare.inject_replicas.{changed[0]} is set but 'inject_replicas' "
                              "is not in prepare.stages: add it before 'write' (or remove the "
                              "setting)")
        return
    if not o.benchmark:
        raise ConfigError("prepare.inject_replicas.benchmark is empty: name the benchmark JSONL")
    if o.k < 0:
        raise ConfigError(f"prepare.inject_replicas.k must be >= 0, got {o.k}")
    after = cfg.stages[cfg.stages.index("inject_replicas") + 1:]
    undo = [s for s in after if s in UNDO_INJECTION
            and not (s == "decontaminate" and cfg.decontaminate.mode == "tag")]
    if undo:
        raise ConfigError(f"prepare.stages: '{undo[0]}' after 'inject_replicas' would remove the "
                          "injected replicas: put 'inject_replicas' after it (a decontaminate "
                          "stage may follow in mode 'tag', to check that they are found)")


def _check_perplexity(cfg: PrepareConfig, on: set[str]) -> None:
    p = cfg.perplexity
    _choice("perplexity.mode", p.mode, SELECTION_MODES)
    if "perplexity" in on and not p.run_dir:
        raise ConfigError("prepare.perplexity.run_dir is empty: name the Kiln run whose checkpoint "
                     "scores the documents")
    if p.batch_size < 1 or p.max_tokens_per_doc < 0:
        raise ConfigError("prepare.perplexity: batch_size >= 1 and max_tokens_per_doc >= 0 required")
    if "perplexity_select" not in on:
        return
    if p.mode == "drop_extremes":
        if not 0.0 <= p.low_q < p.high_q <= 1.0:
            raise ConfigError(f"prepare.perplexity.low_q/high_q: need 0 <= low_q < high_q <= 1 for "
                         f"mode 'drop_extremes', got {p.low_q}, {p.high_q}")
    elif not 0.0 < p.fraction <= 1.0:
        raise ConfigError(f"prepare.perplexity.fraction must be in (0, 1] for mode '{p.mode}', "
                     f"got {p.fraction}")


def decontaminate_pii_types(cfg: PrepareConfig) -> list[str] | None:
    """The PII types a `pii` stage redacts before `decontaminate` (None when it does not run
    before it): the index then holds each benchmark item as that stage leaves it too."""
    stages = cfg.stages
    if "pii" not in stages or "decontaminate" not in stages:
        return None
    if stages.index("pii") > stages.index("decontaminate"):
        return None
    return list(cfg.pii.types or PII_TYPE_NAMES)


def period_bounds(name: str) -> tuple[int, int]:
    """(start, end) of "START-END" (Chronoberg's bucket names have this form)."""
    m = PERIOD.match(name)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ConfigError(f"prepare.period.periods: '{name}' is not a period like '1800-1849'")
    return int(m.group(1)), int(m.group(2))


def _check_period(cfg: PrepareConfig, on: set[str]) -> None:
    for name in cfg.period.periods:
        period_bounds(name)
    if "period" in on and not cfg.period.periods:
        raise ConfigError("prepare.period.periods is empty: name buckets such as '1800-1849'")


def validate_prepare(cfg: PrepareConfig, making_data: bool = False) -> PrepareConfig:
    """Reject impossible prepare configs, naming the key (called by kiln.config_checks.validate).
    `making_data` (build_pipeline): also the checks added since runs were prepared without
    them (a reader after the first stage), which refuse making data that way again but not
    loading such a run's recorded config, so its model still trains, evaluates and exports."""
    _check_stage_list(cfg, making_data)
    _check_stage_options(cfg)
    if cfg.executor not in EXECUTORS:
        raise ConfigError(f"prepare.executor: '{cfg.executor}' is not one of {list(EXECUTORS)}")
    for key in ("tasks", "workers", "cpus_per_task", "mem_per_cpu_gb"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"prepare.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.executor == "slurm" and not cfg.slurm_partition:
        raise ConfigError("prepare.executor = 'slurm' needs prepare.slurm_partition")
    return cfg
