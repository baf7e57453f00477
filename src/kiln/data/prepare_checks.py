"""The `[prepare]` config's load-time refusals: impossible stage lists and option values, each
refused in one line naming the key and the fix, before any work is done.

Why its own: the options and the stage table (`prepare_config`) say what a prepare may be
set to; these checks say which combinations are refused, as `config_checks` does for the
rest of the config (which calls `validate_prepare`). Kept free of heavy imports too.
"""

from __future__ import annotations

import dataclasses
import difflib

from kiln.data.prepare_config import (
    EXECUTORS,
    KILN_JUDGE,
    LANGUAGES,
    NEEDS_AFTER,
    NEEDS_BEFORE,
    PII_TYPE_NAMES,
    QUALITY_DOMAINS,
    READS_FROM,
    SELECTION_MODES,
    STAGES,
    ArxivOptions,
    BrainRotArmsOptions,
    BrainRotM1Options,
    BrainRotM2Options,
    DedupExactOptions,
    DedupMinhashOptions,
    InjectOptions,
    LanguageOptions,
    PeriodOptions,
    PerplexityOptions,
    PrepareConfig,
    QualityOptions,
    arms_labels,
    period_bounds,
)
from kiln.errors import ConfigError

# prepare.tasks and .workers: datatrove's 5-digit task names; 1,000,000 tasks of a local run
# made some 4M log and stats files (2,000 tasks over 3 files: 8,000 files, 2 minutes)
MAX_TASKS = 100_000


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
        _refuse_stages_before_conversion(stages)
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


def _refuse_stages_before_conversion(stages: list[str]) -> None:
    """`arxiv_sources` first (a folder of archives, no metadata snapshot) gives each paper an
    empty text until `latex` converts its archive: a stage between them judged nothing
    (`dedup_exact` there dropped every paper, `language` too, as undetermined: the prepare
    ended in "all N documents were dropped" after reading them all). After
    `arxiv_metadata` the text there is the paper's abstract, a real text to judge. `dating`
    and `period` need no text (a paper's arXiv id dates it): there they drop the papers out
    of the period before any is converted."""
    if not stages or stages[0] != "arxiv_sources" or "latex" not in stages:
        return  # NEEDS_AFTER says a missing latex
    early = [s for s in stages[1:stages.index("latex")] if s not in ("dating", "period")]
    if early:
        raise ConfigError(
            f"prepare.stages: {', '.join(map(repr, early))} stand{'s' if len(early) == 1 else ''}"
            " between 'arxiv_sources' and 'latex', where the papers have no text yet (read "
            "from prepare.arxiv.source_dir alone; 'latex' converts them): place it after 'latex'")


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
    _choice("language.mode", cfg.language.mode, ("drop", "tag"))
    for code in cfg.language.languages:
        _choice("language.languages", code, LANGUAGES)
    if "language" in on and cfg.language.mode == "drop" and not cfg.language.languages:
        raise ConfigError("prepare.language.languages is empty: every document would be dropped "
                          "(list the codes to keep, e.g. [\"en\"], or set language.mode = \"tag\")")
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
    if not 0 <= m.seed < 2**32:  # else a traceback from numpy, after the stages before it ran
        raise ConfigError(f"prepare.dedup_minhash.seed must be in [0, 2**32) (datatrove seeds "
                          f"numpy's RandomState with it), got {m.seed}")
    _check_perplexity(cfg, on)
    b1, b2 = cfg.brain_rot_m1, cfg.brain_rot_m2
    _choice("brain_rot_m1.mode", b1.mode, ("drop", "tag"))
    if "brain_rot_m1" in on and not b1.tokenizer:
        raise ConfigError("prepare.brain_rot_m1.tokenizer is empty: give a local tokenizer.json for "
                     "token lengths (the paper counts Llama-3 tokens)")
    if not b1.popularity_keys:
        raise ConfigError("prepare.brain_rot_m1.popularity_keys must name at least one field")
    for key, value, low, why in (  # counts are >= 0: junk is `tokens < junk_max_tokens`
            ("junk_max_tokens", b1.junk_max_tokens, 1, "at 0 no document is junk"),
            ("control_min_tokens", b1.control_min_tokens, 0, "a document's token count"),
            ("popularity_threshold", b1.popularity_threshold, 0,
             "popularity counts are >= 0: below 0 no document is control")):
        if value < low:
            raise ConfigError(f"prepare.brain_rot_m1.{key} = {value} must be >= {low} ({why})")
    twice = sorted({k for k in b1.popularity_keys if b1.popularity_keys.count(k) > 1})
    if twice:  # the sum would count that field twice: a tweet with 300 likes at 600
        raise ConfigError(f"prepare.brain_rot_m1.popularity_keys names {twice} more than once")
    _choice("brain_rot_m2.mode", b2.mode, ("drop", "tag"))
    if b2.judge != "heuristic" and not (b2.judge.startswith(KILN_JUDGE)
                                        and len(b2.judge) > len(KILN_JUDGE)):
        raise ConfigError(f"prepare.brain_rot_m2.judge: '{b2.judge}' is neither 'heuristic' nor "
                     "'kiln:RUN_DIR'")
    if not 0.0 <= b2.threshold <= 1.0:
        raise ConfigError(f"prepare.brain_rot_m2.threshold must be in [0, 1], got {b2.threshold}")
    _check_arms(cfg, on)
    _check_period(cfg, on)
    a = cfg.arxiv
    if "arxiv_metadata" in on and not a.snapshot:
        raise ConfigError("prepare.arxiv.snapshot is empty: the arXiv metadata snapshot (JSON lines)")
    if "arxiv_sources" in on and not a.source_dir:
        raise ConfigError("prepare.arxiv.source_dir is empty: the folder of source archives")
    if not a.categories:
        raise ConfigError("prepare.arxiv.categories is empty: no paper would be kept")
    _check_arxiv_numbers(a)


def _check_arxiv_numbers(a: ArxivOptions) -> None:
    """Counts and limits in range: a `limit = -1` (a common spelling of "no limit") stopped
    each task after its first paper, a limit of 0 bytes refused every archive."""
    if a.limit < 0:
        raise ConfigError(f"prepare.arxiv.limit must be >= 0 (0: every paper), got {a.limit}")
    if a.min_abstract_words < 0:
        raise ConfigError(f"prepare.arxiv.min_abstract_words must be >= 0, got {a.min_abstract_words}")
    for key in ("max_member_bytes", "max_total_bytes", "max_members"):
        if getattr(a, key) < 1:
            raise ConfigError(f"prepare.arxiv.{key} must be >= 1, got {getattr(a, key)}")
    if not a.max_ratio > 0:
        raise ConfigError(f"prepare.arxiv.max_ratio must be > 0, got {a.max_ratio}")


# stages that would remove injected replicas (all but one copy, or every one) after they are
# put in: the study would not train on the k replicas it reports
UNDO_INJECTION = ("dedup_exact", "dedup_minhash", "decontaminate")
# stages that would rewrite them: the study trains on the benchmark's own text (`pii` turns
# "John Smith has 3 apples" into "<NAME> has 3 apples"), while the manifest reports k replicas
REWRITE_INJECTION = ("pii",)
# stages that keep every document as it is (they add metadata, or write) and so may follow
# the injection; any other filter there (quality, language, period, a selection...) may drop
# replicas (those above are refused with their own reason)
KEEP_INJECTION = ("write", "dating", "perplexity")


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


def _refuse_changing_replicas(cfg: PrepareConfig) -> None:
    """Stages after the injection that would rewrite or may drop replicas (checks added
    since runs were prepared so: refused when making data, not when loading such a run's
    recorded config)."""
    if "inject_replicas" not in cfg.stages:
        return
    after = cfg.stages[cfg.stages.index("inject_replicas") + 1:]
    rewrite = [s for s in after if s in REWRITE_INJECTION]
    if rewrite:
        raise ConfigError(f"prepare.stages: '{rewrite[0]}' after 'inject_replicas' would rewrite "
                          "the injected replicas, which are to be the benchmark's own text: put "
                          "'inject_replicas' after it")
    tagging = {"language": cfg.language.mode, "brain_rot_m1": cfg.brain_rot_m1.mode,
               "brain_rot_m2": cfg.brain_rot_m2.mode}
    drops = [s for s in after if s not in (*KEEP_INJECTION, *UNDO_INJECTION, *REWRITE_INJECTION)
             and tagging.get(s) != "tag"]
    if drops:
        tag = " (or run it in mode 'tag')" if drops[0] in tagging else ""
        raise ConfigError(f"prepare.stages: '{drops[0]}' after 'inject_replicas' may drop or "
                          "change injected replicas, and the study would train on other than "
                          f"the k copies it reports: put 'inject_replicas' after it{tag}")


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
        if p.count:
            raise ConfigError("prepare.perplexity.count is for modes 'top_fraction' and "
                              "'bottom_fraction'; 'drop_extremes' keeps a quantile band")
        if not 0.0 <= p.low_q < p.high_q <= 1.0:
            raise ConfigError(f"prepare.perplexity.low_q/high_q: need 0 <= low_q < high_q <= 1 for "
                         f"mode 'drop_extremes', got {p.low_q}, {p.high_q}")
    elif p.count < 0:
        raise ConfigError(f"prepare.perplexity.count must be >= 0, got {p.count}")
    elif p.count and p.fraction:
        raise ConfigError("prepare.perplexity: set fraction or count, not both (count keeps "
                          "that many documents, the paper's ndoc; fraction a share of them)")
    elif not p.count and not 0.0 < p.fraction <= 1.0:
        raise ConfigError(f"prepare.perplexity.fraction must be in (0, 1] for mode '{p.mode}' "
                          f"(or set count), got {p.fraction}")


def _check_arms(cfg: PrepareConfig, on: set[str]) -> None:
    o = cfg.brain_rot_arms
    _choice("brain_rot_arms.labels", o.labels, ("", "m1", "m2"))
    if not 0.0 <= o.ratio <= 1.0:
        raise ConfigError(f"prepare.brain_rot_arms.ratio must be in [0, 1] (the junk share of the "
                          f"budget), got {o.ratio}")
    if o.budget < 0:
        raise ConfigError(f"prepare.brain_rot_arms.budget must be >= 0 tokens (0: as many as the "
                          f"scarcer arm holds), got {o.budget}")
    if "brain_rot_arms" not in on:
        return
    before = cfg.stages[: cfg.stages.index("brain_rot_arms")]
    after = [s for s in cfg.stages[cfg.stages.index("brain_rot_arms") + 1:] if s != "write"]
    if after:  # a stage after it drops or edits what the budget counted: arms off their shares
        raise ConfigError(f"prepare.stages: 'brain_rot_arms' must be the last stage before "
                          f"'write' (after it: {', '.join(map(repr, after))}, which would drop "
                          "or change documents the budget counted, leaving the arms off their "
                          "shares); move those before it")
    labels = arms_labels(cfg)
    if not labels:
        raise ConfigError("prepare.stages: 'brain_rot_arms' follows both 'brain_rot_m1' and "
                          "'brain_rot_m2': set prepare.brain_rot_arms.labels to 'm1' or 'm2'")
    stage = f"brain_rot_{labels}"
    if stage not in before:
        raise ConfigError(f"prepare.brain_rot_arms.labels = '{labels}' needs '{stage}' before "
                          "'brain_rot_arms' in prepare.stages")
    if getattr(cfg, stage).mode != "tag":
        raise ConfigError(f"prepare.{stage}.mode must be 'tag' before 'brain_rot_arms': mode "
                          f"'{getattr(cfg, stage).mode}' drops the junk the arms are built from")
    if labels == "m1" and o.tokenizer:
        raise ConfigError("prepare.brain_rot_arms.tokenizer is for M2 labels: with M1's the budget "
                          "counts M1's own `m1_tokens` (prepare.brain_rot_m1.tokenizer); clear it")
    if labels == "m2" and not o.tokenizer:  # its own: an unused stage's option is no setting
        raise ConfigError("prepare.brain_rot_arms.tokenizer is empty: M2 labels need a local "
                          "tokenizer.json to count the budget's tokens (the paper counts Llama-3 "
                          "tokens; a Kiln run's tokenizer/tokenizer.json will do)")


def _check_period(cfg: PrepareConfig, on: set[str]) -> None:
    for name in cfg.period.periods:
        period_bounds(name)
    if "period" in on and not cfg.period.periods:
        raise ConfigError("prepare.period.periods is empty: name buckets such as '1800-1849'")


# settings that only a stage not in the list would read: (stage, table, keys, defaults, and
# the stage that must run for the setting to count, None: always; `arxiv` is one table for
# two stages, and a recipe's table with no arXiv stage at all changes no data)
_READ_ONLY_BY = (
    ("perplexity_select", "perplexity", ("mode", "fraction", "count", "low_q", "high_q"),
     PerplexityOptions(), None),
    ("language", "language", ("languages", "mode", "strip_math"), LanguageOptions(), None),
    ("period", "period", ("periods", "keep_undated"), PeriodOptions(), None),
    ("arxiv_metadata", "arxiv", ("snapshot", "categories", "min_year", "min_abstract_words",
                                 "limit"), ArxivOptions(), "arxiv_sources"),
    ("perplexity", "perplexity", ("run_dir", "batch_size", "max_tokens_per_doc", "device"),
     PerplexityOptions(), None),
    *((t, t, tuple(f.name for f in dataclasses.fields(o)), o, None) for t, o in (
        ("quality", QualityOptions()), ("brain_rot_m1", BrainRotM1Options()),
        ("brain_rot_m2", BrainRotM2Options()), ("brain_rot_arms", BrainRotArmsOptions()),
        ("dedup_exact", DedupExactOptions()), ("dedup_minhash", DedupMinhashOptions()))),
)


def _refuse_unread_settings(cfg: PrepareConfig) -> None:
    """A stage's setting with the stage left out of prepare.stages: it was accepted and
    ignored (`perplexity` alone scores and keeps every document; no language filter runs;
    a [prepare.brain_rot_m2] threshold without the stage filtered no junk; `dating` alone
    keeps every period; `arxiv_sources` first reads every archive of the folder, whatever
    the categories or years)."""
    for stage, table, keys, defaults, running in _READ_ONLY_BY:
        options = getattr(cfg, table)
        changed = [k for k in keys if getattr(options, k) != getattr(defaults, k)]
        if stage not in cfg.stages and changed and (running is None or running in cfg.stages):
            raise ConfigError(f"prepare.{table}.{changed[0]} is set but '{stage}' is not in "
                              f"prepare.stages: add the stage, or remove the setting (nothing "
                              "reads it)")
    p = cfg.perplexity
    if "perplexity_select" in cfg.stages:  # another mode's setting: the band, or the share
        keys = ("fraction",) if p.mode == "drop_extremes" else ("low_q", "high_q")
        changed = [k for k in keys if getattr(p, k) != getattr(PerplexityOptions(), k)]
        if changed:
            reads = "low_q and high_q" if p.mode == "drop_extremes" else "fraction or count"
            raise ConfigError(f"prepare.perplexity.{changed[0]} is set but mode '{p.mode}' "
                              f"does not read it (it keeps by {reads}): set the mode that "
                              "reads it, or remove the setting")


def validate_prepare(cfg: PrepareConfig, making_data: bool = False) -> PrepareConfig:
    """Reject impossible prepare configs, naming the key (called by kiln.config_checks.validate).
    `making_data` (build_pipeline): also the checks added since runs were prepared without
    them (a reader after the first stage), which refuse making data that way again but not
    loading such a run's recorded config, so its model still trains, evaluates and exports."""
    _check_stage_list(cfg, making_data)
    _check_stage_options(cfg)
    if making_data:
        _refuse_unread_settings(cfg)
        _refuse_changing_replicas(cfg)
    if cfg.executor not in EXECUTORS:
        raise ConfigError(f"prepare.executor: '{cfg.executor}' is not one of {list(EXECUTORS)}")
    for key in ("tasks", "workers", "cpus_per_task", "mem_per_cpu_gb"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"prepare.{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("tasks", "workers"):
        if getattr(cfg, key) > MAX_TASKS:
            raise ConfigError(f"prepare.{key} must be from 1 to {MAX_TASKS:,} (datatrove names a "
                              "task's files with 5 digits, and every task leaves its log, stats "
                              "and completion files, even one that reads nothing), got "
                              f"{getattr(cfg, key):,}")
    if cfg.executor == "slurm" and not cfg.slurm_partition:
        raise ConfigError("prepare.executor = 'slurm' needs prepare.slurm_partition")
    return cfg
