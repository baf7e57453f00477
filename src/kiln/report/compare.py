"""Set a run beside others: overlaid curves and a table of headline figures.

`kiln report RUN --compare OTHER [--compare ...]` (or `build_report(run, compare=[...])`) adds a
"Comparison" section with ``plots/compare_loss.png`` (train loss and validation bits per
byte of every run against step) and one table row per run: final train loss, best val bpb,
parameters, active parameters per token (MoE runs count top_k of their experts) and mean
tokens/s; then Hedges' g between the runs' per-window held-out losses where their evals
scored the same windows (`kiln.report.effect_sizes`). The runs named with --compare must be run directories with a ``metrics.jsonl``;
a missing one is an error, since the user asked for it by name.

Loss is nats per token of each run's own tokenizer, and bits per byte are measured on each
run's own validation split: the section says so (and `kiln report` warns) when the runs'
token shards record other tokenizers or other validation data (`tokens/index.json`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kiln.atomic import atomic_path
from kiln.data.provenance import shards_documents
from kiln.errors import ConfigError
from kiln.report.effect_sizes import WindowLosses, effect_size_html, load_window_losses
from kiln.report.fmt import as_number, fmt_count, fmt_float
from kiln.report.html_parts import grid_table, image, paragraph, section
from kiln.report.metrics_io import records_of_kind
from kiln.report.plots import (
    MOST_MARKERS,
    Series,
    draw_line,
    note_dropped,
    series,
    widen_one_step,
)
from kiln.report.run_files import Loaded, load_json, load_metrics
from kiln.report.summary import Summary, summarize

COMPARE_PLOT = "compare_loss"
COLUMNS = ["run", "final train loss", "best val bpb", "params", "active params", "tokens/s"]


@dataclass
class RunFigures:
    """What the comparison needs from one run directory."""

    label: str
    records: list[dict[str, Any]]
    summary: Summary
    params: float | None = None
    params_active: float | None = None
    tokenizer: str | None = None  # the tokenizer file's hash its shards record
    val_data: tuple | None = None  # (documents fingerprint, val_fraction, seed)
    windows: WindowLosses | None = None  # per-window eval losses, for Hedges' g


def _labels(paths: list[Path]) -> list[str]:
    """Each run's shortest path suffix that no other run's ends with the same way: its
    directory name alone where that is unique (/x/a/run and /y/a/run: x/a/run, y/a/run).
    A name's bytes that are not UTF-8 show as ``\\xff``: Python holds them as lone
    surrogates, which matplotlib cannot draw (the legend's text raised a traceback)."""
    parts = [p.resolve().parts for p in paths]

    def label(i: int) -> str:
        for k in range(1, len(parts[i]) + 1):
            if all(other[-k:] != parts[i][-k:] for j, other in enumerate(parts) if j != i):
                break
        return os.fsencode(Path(*parts[i][-k:])).decode("utf-8", "backslashreplace")

    return [label(i) for i in range(len(parts))]


def load_run_figures(run_dir: Path, label: str, required: bool = True,
                     metrics: Loaded | None = None) -> RunFigures:
    """Records, summary and parameter counts of `run_dir`. With `required`, a directory
    without a readable metrics.jsonl raises FileNotFoundError naming it. `metrics`: its
    metrics.jsonl already read (a long run's is gigabytes: read once per report)."""
    metrics = load_metrics(run_dir) if metrics is None else metrics
    if not metrics.ok and required:
        untrained = (run_dir / "config.toml").is_file() and not (run_dir / "metrics.jsonl").exists()
        why = ("a run not trained yet: `kiln train` it first" if untrained
               else "expected a Kiln run directory")
        raise FileNotFoundError(f"cannot compare with {run_dir}: {metrics.problem} ({why})")
    records = metrics.value if metrics.ok else []
    model = load_json(run_dir, "model.json")
    counts = model.value if model.ok else {}
    index = load_json(run_dir, "tokens/index.json")
    made = index.value.get("made_from") if index.ok else None
    made = made if isinstance(made, dict) else {}
    val_data = (shards_documents(run_dir, made), index.value.get("val_fraction"),
                index.value.get("seed")) if made.get("documents") else None
    return RunFigures(label, records, summarize(records) if records else Summary(),
                      as_number(counts.get("params")), as_number(counts.get("params_active")),
                      _hashable(made.get("tokenizer")), _hashable(val_data),
                      load_window_losses(run_dir))


def _hashable(value: Any) -> Any:
    """`value` with its lists and objects as tuples: the runs are grouped by it
    (`comparability_warnings`), and an index.json edited to hold a list there (a seed of
    []) failed the whole report with a TypeError traceback."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    return value


def comparability_warnings(runs: list[RunFigures]) -> list[str]:
    """What makes the overlaid curves compare less than they seem (runs that do not record
    their data are left out of the check)."""
    out = []
    for attr, what in (("tokenizer", "tokenizers differ: train loss is nats per token of "
                                     "each run's own tokenizer, so only bits per byte compare"),
                       ("val_data", "validation data differ (other documents or another "
                                    "split): val bits per byte are measured on other text")):
        groups: dict[object, list[str]] = {}
        for run in runs:
            if getattr(run, attr) is not None:
                groups.setdefault(getattr(run, attr), []).append(run.label)
        if len(groups) > 1:
            sides = " vs ".join(", ".join(labels) for labels in groups.values())
            out.append(f"the runs' {what} ({sides})")
    return out


def load_comparison(run_dir: Path, others: list[Path],
                    own: Loaded | None = None) -> list[RunFigures]:
    """The report's own run first (tolerated when empty; `own`: its metrics.jsonl as the
    report read it), then every --compare run."""
    paths = [Path(run_dir), *map(Path, others)]
    seen: dict[str, Path] = {}
    for path in paths[1:]:  # a typo, refused as a target that is no run is (exit status 2)
        if not os.path.lexists(path):
            raise ConfigError(f"--compare {path}: nothing is there; give a Kiln run directory")
        if not (path / "config.toml").is_file() and not (path / "metrics.jsonl").exists():
            raise ConfigError(f"--compare {path} is not a Kiln run directory (no config.toml "
                              "or metrics.jsonl); give one")
    for path in paths:
        real = str(path.resolve())
        if real in seen:
            what = "the report's own run" if seen[real] == paths[0] else f"--compare {seen[real]}"
            raise ConfigError(f"--compare {path} names {what} again: each run once")
        seen[real] = path
    labels = _labels(paths)
    return [load_run_figures(p, lab, required=i > 0, metrics=own if i == 0 else None)
            for i, (p, lab) in enumerate(zip(paths, labels))]


def write_compare_plot(runs: list[RunFigures], path: Path) -> None:
    """Two panels, train loss and val bits/byte against step, one colour per run."""
    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    loss_ax, bpb_ax = fig.subplots(1, 2)
    drawn: dict[Any, list[Series]] = {loss_ax: [], bpb_ax: []}
    for i, run in enumerate(runs):
        colour = f"C{i}"
        label = run.label.replace("$", r"\$")  # a directory name is text, not mathtext
        loss = series(records_of_kind(run.records, "train"), "loss", label)
        bpb = series(records_of_kind(run.records, "val"), "val_bpb", label)
        drawn[loss_ax].append(loss)
        drawn[bpb_ax].append(bpb)
        if loss.steps:  # one point: a marker, not a void; a long run's: bucket means
            draw_line(loss_ax, loss, label, color=colour)
        if len(bpb.steps) > MOST_MARKERS:
            draw_line(bpb_ax, bpb, label, color=colour)
        elif bpb.steps:
            bpb_ax.plot(bpb.steps, bpb.values, "o-", color=colour, markersize=4, label=label)
    for ax, title, ylabel in ((loss_ax, "Train loss", "loss (nats/token)"),
                              (bpb_ax, "Validation bits per byte", "bits/byte")):
        widen_one_step(ax, [int(x) for line in ax.lines for x in line.get_xdata()])
        note_dropped(ax, drawn[ax])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if ax.lines:  # labels given outright: legend() alone hides names starting with "_"
            ax.legend(ax.lines, [line.get_label() for line in ax.lines])
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def comparison_rows(runs: list[RunFigures]) -> list[list[str]]:
    return [[r.label, fmt_float(r.summary.final_train_loss), fmt_float(r.summary.best_val_bpb),
             fmt_count(r.params), fmt_count(r.params_active), fmt_count(r.summary.mean_tokens_per_s)]
            for r in runs]


def compare_section(runs: list[RunFigures], plots_dir: Path) -> str:
    """Write the overlay plot and return the section's HTML."""
    write_compare_plot(runs, plots_dir / f"{COMPARE_PLOT}.png")
    note = paragraph("tokens/s: mean over the second half of each run's steps; active params: "
                     "per token (routed experts count top_k of n_experts).", "muted")
    notes = comparability_warnings(runs)
    effects, alerts, lines = effect_size_html(
        [r.label for r in runs], [r.windows or WindowLosses(problem="not loaded") for r in runs])
    for line in lines:
        print(f"--compare: {line}")
    for note_text in [*notes, *alerts]:  # on the console too: the page alone would hide it
        warnings.warn(f"--compare: {note_text}", stacklevel=2)
    body = ("".join(paragraph(f"Note: {w}.", "missing") for w in notes) + image(f"plots/{COMPARE_PLOT}.png", "train loss and val bits/byte of every run")
            + grid_table(COLUMNS, comparison_rows(runs)) + note + effects)
    return section("Comparison", body)
