"""Turn a run directory into ``report.html`` plus PNG plots in ``plots/``."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

from kiln.atomic import write_text_atomic
from kiln.export_recovery import holds_exported_model, recover_export
from kiln.report.compare import compare_section, load_comparison
from kiln.report.fmt import as_number
from kiln.report.html_parts import page
from kiln.report.plots import write_plots
from kiln.report.run_files import latest_checkpoint_name, load_json, load_metrics, load_text
from kiln.report.sections_moe import moe_section
from kiln.report.sections_results import (
    eval_section,
    export_section,
    plots_section,
    samples_section,
)
from kiln.report.sections_run import (
    config_section,
    data_section,
    environment_section,
    model_section,
    summary_section,
    tokens_section,
)
from kiln.report.sections_yield import yield_section
from kiln.report.summary import Summary, summarize
from kiln.training_now import trainer_holding

# what any stage of a run leaves behind; a folder with none of them is not a run
_RUN_FILES = ("config.toml", "prepare.json", "tokens/index.json", "metrics.jsonl", "eval.json")


def build_report(run_dir: Path, compare: list[Path] | None = None) -> Path:
    """Write ``run_dir/report.html`` (and ``run_dir/plots/*.png``); return its path.

    Every input is optional: a missing or unreadable file turns its section into
    a "not available (...)" note, so a crashed or half-finished run still gets a
    report. ``compare``: other run directories to set beside this one (each must
    have a metrics.jsonl, checked before anything is written).
    """
    run_dir = Path(run_dir)
    if not any((run_dir / name).exists() for name in _RUN_FILES):
        raise FileNotFoundError(
            f"nothing to report in {run_dir}: it holds none of {', '.join(_RUN_FILES)} "
            "(run kiln prepare or kiln run first, or give the run's directory)")
    metrics = load_metrics(run_dir)  # once: the comparison takes it as read
    compared = load_comparison(run_dir, list(compare), own=metrics) if compare else None
    if note := recover_export(run_dir / "export", run_dir):  # a killed export's, put back
        warnings.warn(note, stacklevel=2)
    index = load_json(run_dir, "tokens/index.json")
    evaluation = load_json(run_dir, "eval.json")
    unigram = as_number(index.value.get("unigram_bpb")) if index.ok else None
    if unigram is None and evaluation.ok:
        unigram = as_number(evaluation.value.get("unigram_bpb"))
    records = metrics.value if metrics.ok else []
    plots = write_plots(records, run_dir / "plots", unigram) if records else {}
    if compared:  # summarized with the comparison's figures already
        summary = compared[0].summary
    else:
        summary = summarize(records) if records else Summary()
    config = load_text(run_dir, "config.toml")
    extra = [compare_section(compared, run_dir / "plots")] if compared else []
    moe = moe_section(records, plots, config)
    latest = latest_checkpoint_name(run_dir)
    sections = [
        summary_section(metrics, summary, latest, trainer_holding(run_dir), config),
        *extra,
        plots_section(metrics, plots),
        *([moe] if moe else []),
        eval_section(evaluation, unigram, latest),
        samples_section(load_json(run_dir, "samples.json", expect=list), latest),
        export_section(load_json(run_dir, "export/kiln_export.json"), latest,
                       holds_exported_model(run_dir / "export")),
        model_section(load_json(run_dir, "model.json")),
        tokens_section(index),
        data_section(load_json(run_dir, "prepare.json")),
        yield_section(load_json(run_dir, "yield.json")),
        environment_section(load_json(run_dir, "env.json")),
        config_section(config),
    ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    html_text = page(
        f"Kiln run report — {run_dir.resolve().name}",
        sections,
        footer=f"Generated {stamp} from {run_dir.resolve()}",
    )
    out = run_dir / "report.html"
    write_text_atomic(out, html_text)
    return out
