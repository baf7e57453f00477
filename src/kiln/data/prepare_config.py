"""The `[prepare]` config: stage list, executor, and typed options per stage; checked at load time.

Kept free of heavy imports (no datatrove, torch or spaCy), so `import kiln.config` stays cheap:
the stage factories in `kiln.data.stages` import what they need only when a pipeline is built.
Per-stage options are sub-tables (`[prepare.quality]`, `[prepare.decontaminate]`...); an unknown
key fails with the closest valid one (kiln.config's loader), and `validate_prepare`
(`prepare_checks`) rejects impossible combinations naming the key, before any work is done.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from kiln.errors import ConfigError

EXECUTORS = ("local", "slurm", "ray")
# exact dedup of the final text (the arXiv digest): two files that differ only in what PII
# redaction replaces are one document after it
DEFAULT_STAGES = ["read", "quality", "pii", "dedup_exact", "write"]
QUICKSTART_STAGES = DEFAULT_STAGES  # + "decontaminate" before "write" when benchmarks are given
ARXIV_STAGES = [
    "arxiv_metadata", "arxiv_sources", "latex", "language", "quality", "pii", "dedup_exact",
    "decontaminate", "write",
]
# Copies of constants that live next to heavy imports; tests assert they stay equal.
QUALITY_DOMAINS = ("prose", "latex", "code")  # kiln.data.filters.quality.DOMAINS
PII_TYPE_NAMES = ("KEY", "USERNAME", "EMAIL", "PASSWORD", "NAME", "IP_ADDRESS")  # pii.spans
ARXIV_CATEGORIES = ("math", "cs", "hep-th", "hep-ph", "quant-ph", "stat.ML", "stat.TH")
SELECTION_MODES = ("top_fraction", "bottom_fraction", "drop_extremes")  # filters.selection
# filters.language.profile_languages(): the languages langdetect has profiles for
LANGUAGES = (
    "af", "ar", "bg", "bn", "ca", "cs", "cy", "da", "de", "el", "en", "es", "et", "fa", "fi",
    "fr", "gu", "he", "hi", "hr", "hu", "id", "it", "ja", "kn", "ko", "lt", "lv", "mk", "ml",
    "mr", "ne", "nl", "no", "pa", "pl", "pt", "ro", "ru", "sk", "sl", "so", "sq", "sv", "sw",
    "ta", "te", "th", "tl", "tr", "uk", "ur", "vi", "zh-cn", "zh-tw",
)
KILN_JUDGE = "kiln:"  # brain_rot_m2.judge = "kiln:RUN_DIR": a Kiln run's checkpoint as judge
PERIOD = re.compile(r"^(\d{3,4})-(\d{3,4})$")  # Chronoberg bucket names have this form too


@dataclass
class QualityOptions:
    # the default corpus is the Python standard library, hence "code"; use "prose" for web text
    domain: str = "code"  # prose | latex | code


@dataclass
class LanguageOptions:
    languages: list[str] = field(default_factory=lambda: ["en"])  # langdetect codes kept
    mode: str = "drop"  # drop | tag (keep all; metadata language, language_score)
    strip_math: bool = True  # judge the text without math spans and LaTeX commands


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
    tokenizer: str = ""  # tokenizer.json: size in its tokens (+ EOS a document); "": in words


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
    fraction: float = 0.0  # top/bottom_fraction: share of scored documents kept (or count)
    count: int = 0  # top/bottom_fraction: keep this many scored documents (the paper's ndoc)
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
class BrainRotArmsOptions:
    labels: str = ""  # m1 | m2 | "" (the one of brain_rot_m1 / brain_rot_m2 before the stage)
    ratio: float = 0.5  # junk share of the budget's tokens, in [0, 1] (0: control arm, 1: junk)
    budget: int = 0  # tokens of the arm; 0: min(junk, control tokens of the pool)
    seed: int = 0  # fill order (filters.arms.order_key)
    tokenizer: str = ""  # m2 labels: tokenizer.json for the counts (needed then)


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
    language: LanguageOptions = field(default_factory=LanguageOptions)
    pii: PIIOptions = field(default_factory=PIIOptions)
    decontaminate: DecontaminateOptions = field(default_factory=DecontaminateOptions)
    inject_replicas: InjectOptions = field(default_factory=InjectOptions)
    dedup_exact: DedupExactOptions = field(default_factory=DedupExactOptions)
    dedup_minhash: DedupMinhashOptions = field(default_factory=DedupMinhashOptions)
    perplexity: PerplexityOptions = field(default_factory=PerplexityOptions)
    brain_rot_m1: BrainRotM1Options = field(default_factory=BrainRotM1Options)
    brain_rot_m2: BrainRotM2Options = field(default_factory=BrainRotM2Options)
    brain_rot_arms: BrainRotArmsOptions = field(default_factory=BrainRotArmsOptions)
    period: PeriodOptions = field(default_factory=PeriodOptions)
    arxiv: ArxivOptions = field(default_factory=ArxivOptions)


# stages that rewrite a document's text (not only drop it or tag it): counts taken before
# one of them (M1's `m1_tokens`) no longer describe the text after it
TEXT_EDITING_STAGES = ("latex", "quality", "pii", "gutenberg")


@dataclass(frozen=True)
class StageSpec:
    """Where a stage's factory lives ("module:function"), whether it reads documents in, and
    where the version of its rules is ("module:CONSTANT", beside the rules: a stage that
    keeps, drops or rewrites documents declares one; `kiln.data.stage_rules`)."""

    target: str
    reader: bool = False
    rules: str = ""


_S = "kiln.data.stages"
STAGES: dict[str, StageSpec] = {
    "read": StageSpec(f"{_S}:read_stage", reader=True),
    "arxiv_metadata": StageSpec(f"{_S}:arxiv_metadata_stage", reader=True,
        rules="kiln.data.arxiv.metadata:RULES_VERSION"),
    "arxiv_sources": StageSpec(f"{_S}:arxiv_sources_stage", reader=True,
        rules="kiln.data.arxiv.source_reader:RULES_VERSION"),
    "latex": StageSpec(f"{_S}:latex_stage",
        rules="kiln.data.arxiv.latex:RULES_VERSION"),
    "quality": StageSpec(f"{_S}:quality_stage",
        rules="kiln.data.filters.quality:RULES_VERSION"),
    "language": StageSpec(f"{_S}:language_stage",
        rules="kiln.data.filters.language:RULES_VERSION"),
    "brain_rot_m1": StageSpec(f"{_S}:brain_rot_m1_stage",
        rules="kiln.data.filters.engagement:RULES_VERSION"),
    "brain_rot_m2": StageSpec(f"{_S}:brain_rot_m2_stage",
        rules="kiln.data.filters.semantic:RULES_VERSION"),
    "brain_rot_arms": StageSpec(f"{_S}:brain_rot_arms_stage",
        rules="kiln.data.filters.arms:RULES_VERSION"),
    "perplexity": StageSpec(f"{_S}:perplexity_stage",
        rules="kiln.data.filters.perplexity:RULES_VERSION"),
    "perplexity_select": StageSpec(f"{_S}:perplexity_select_stage",
        rules="kiln.data.filters.selection:RULES_VERSION"),
    "pii": StageSpec(f"{_S}:pii_stage",
        rules="kiln.data.pii.rules_version:PII_RULES"),
    "decontaminate": StageSpec(f"{_S}:decontaminate_stage",
        rules="kiln.data.decontam.filter:RULES_VERSION"),
    "inject_replicas": StageSpec(f"{_S}:inject_replicas_stage",
        rules="kiln.data.decontam.inject:RULES_VERSION"),
    "dedup_exact": StageSpec(f"{_S}:dedup_exact_stage",
        rules="kiln.data.dedup:EXACT_RULES_VERSION"),
    "dedup_minhash": StageSpec(f"{_S}:dedup_minhash_stage",
        rules="kiln.data.dedup:MINHASH_RULES_VERSION"),
    "gutenberg": StageSpec(f"{_S}:gutenberg_stage",
        rules="kiln.data.gutenberg:RULES_VERSION"),
    "dating": StageSpec(f"{_S}:dating_stage",
        rules="kiln.data.dating:DATING_RULES_VERSION"),
    "period": StageSpec(f"{_S}:period_stage",
        rules="kiln.data.dating:PERIOD_RULES_VERSION"),
    "write": StageSpec(f"{_S}:write_stage"),
}

# stage -> stages one of which must come before it (in this list order)
NEEDS_BEFORE = {
    "latex": ("arxiv_sources",),
    "perplexity_select": ("perplexity",),
    "brain_rot_arms": ("brain_rot_m1", "brain_rot_m2"),
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


def decontaminate_pii_types(cfg: PrepareConfig) -> list[str] | None:
    """The PII types a `pii` stage redacts before `decontaminate` (None when it does not run
    before it): the index then holds each benchmark item as that stage leaves it too."""
    stages = cfg.stages
    if "pii" not in stages or "decontaminate" not in stages:
        return None
    if stages.index("pii") > stages.index("decontaminate"):
        return None
    return list(cfg.pii.types or PII_TYPE_NAMES)


def arms_labels(cfg: PrepareConfig) -> str:
    """The labels `brain_rot_arms` reads: `brain_rot_arms.labels`, or "m1" / "m2" for the
    labelling stage before it ("" when neither or both are, which `prepare_checks` refuses)."""
    if cfg.brain_rot_arms.labels:
        return cfg.brain_rot_arms.labels
    stages = cfg.stages
    before = stages[: stages.index("brain_rot_arms")] if "brain_rot_arms" in stages else stages
    found = [m for m in ("m1", "m2") if f"brain_rot_{m}" in before]
    return found[0] if len(found) == 1 else ""


def period_bounds(name: str) -> tuple[int, int]:
    """(start, end) of "START-END" (Chronoberg's bucket names have this form)."""
    m = PERIOD.match(name)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ConfigError(f"prepare.period.periods: '{name}' is not a period like '1800-1849'")
    return int(m.group(1)), int(m.group(2))
