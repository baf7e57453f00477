"""Matplotlib figures of a run's metrics, written as PNGs with the Agg canvas.

Figures are built on ``matplotlib.figure.Figure`` with an explicit Agg canvas
rather than through pyplot, so the report never touches global backend state
of whatever process (a training loop, a notebook) calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kiln.atomic import atomic_path
from kiln.report.fmt import as_number
from kiln.report.metrics_io import records_of_kind


@dataclass
class Series:
    """One line (or set of markers) on a plot."""

    label: str
    steps: list[int]
    values: list[float]
    markers: bool = False


def series(records: list[dict[str, Any]], key: str, label: str, markers: bool = False) -> Series:
    """Steps and values of ``key`` over the records that carry a number for it."""
    pairs = [(r["step"], as_number(r.get(key))) for r in records]
    kept = [(s, v) for s, v in pairs if v is not None]
    return Series(label, [s for s, _ in kept], [v for _, v in kept], markers)


def max_vio_series(train: list[dict[str, Any]]) -> list[Series]:
    """One MaxVio line per MoE layer from the train records' ``moe_max_vio`` lists."""
    rows = [(r["step"], r["moe_max_vio"]) for r in train if isinstance(r.get("moe_max_vio"), list)]
    lines = []
    for j in range(max((len(v) for _, v in rows), default=0)):
        kept = [(s, as_number(v[j])) for s, v in rows if j < len(v)]
        kept = [(s, x) for s, x in kept if x is not None]
        lines.append(Series(f"MoE layer {j}", [s for s, _ in kept], [x for _, x in kept]))
    return lines


def draw_series(ax: Any, lines: list[Series]) -> None:
    """Each series as a line, or as markers where asked or where it has one point (a
    one-point line draws nothing: a run killed after its first record)."""
    for s in lines:
        if s.markers or len(s.steps) == 1:
            ax.plot(s.steps, s.values, "o", markersize=5, label=s.label)
        else:
            ax.plot(s.steps, s.values, "-", linewidth=1.4, label=s.label)
    widen_one_step(ax, [step for s in lines for step in s.steps])


def widen_one_step(ax: Any, steps: list[int]) -> None:
    """Integer step ticks need a span: one step alone would get ticks at 9.45, 9.6, ..."""
    if len(set(steps)) == 1:
        ax.set_xlim(steps[0] - 1, steps[0] + 1)


def save_plot(
    path: Path,
    title: str,
    ylabel: str,
    lines: list[Series],
    baseline: tuple[float, str] | None = None,
) -> None:
    """Draw ``lines`` against step and write the PNG atomically."""
    fig = Figure(figsize=(8, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    draw_series(ax, lines)
    if baseline is not None:
        ax.axhline(baseline[0], linestyle="--", color="gray", linewidth=1.2, label=baseline[1])
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(lines) > 1 or baseline is not None:
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def write_plots(
    records: list[dict[str, Any]], plots_dir: Path, unigram_bpb: float | None
) -> dict[str, Path]:
    """Write every plot the records have data for; return name -> PNG path."""
    train = records_of_kind(records, "train")
    val = records_of_kind(records, "val")
    loss = [
        s
        for s in (
            series(train, "loss", "train loss"),
            series(val, "val_loss", "val loss", markers=True),
        )
        if s.steps
    ]
    bpb = series(val, "val_bpb", "val bits/byte", markers=True)
    speed = series(train, "tokens_per_s", "tokens/s")
    lr = series(train, "lr", "learning rate")
    plans: dict[str, tuple[str, str, list[Series], tuple[float, str] | None]] = {}
    if loss:
        plans["loss"] = ("Loss", "loss (nats/token)", loss, None)
    if bpb.steps:
        # the baseline on the curve's own windows (periodic validation scores a part of the
        # split); runs from before Kiln logged it fall back to the whole split's, said so
        scored = [u for u in (as_number(r.get("val_unigram_bpb")) for r in val) if u is not None]
        base = ((scored[-1], f"unigram baseline {scored[-1]:.3f} (the same windows)") if scored
                else None if unigram_bpb is None
                else (unigram_bpb, f"unigram baseline {unigram_bpb:.3f} (the whole val split)"))
        plans["bpb"] = ("Validation bits per byte", "bits/byte", [bpb], base)
    if speed.steps:
        plans["throughput"] = ("Throughput", "tokens/s", [speed], None)
    if lr.steps:
        plans["lr"] = ("Learning rate", "lr", [lr], None)
    max_vio = max_vio_series(train)
    if max_vio:
        plans["moe_max_vio"] = ("Expert load imbalance per MoE layer", "MaxVio", max_vio, None)
    written = {}
    for name, (title, ylabel, lines, baseline) in plans.items():
        path = plots_dir / f"{name}.png"
        save_plot(path, title, ylabel, lines, baseline)
        written[name] = path
    return written
