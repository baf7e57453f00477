"""Matplotlib figures of a run's metrics, written as PNGs with the Agg canvas.

Figures are built on ``matplotlib.figure.Figure`` with an explicit Agg canvas
rather than through pyplot, so the report never touches global backend state
of whatever process (a training loop, a notebook) calls it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kiln.atomic import atomic_path
from kiln.report.fmt import as_number
from kiln.report.metrics_io import records_of_kind


@dataclass
class Series:
    """One line (or set of markers) on a plot; `dropped`: its (step, value) points that are
    not finite, which matplotlib cannot draw and the plot notes instead."""

    label: str
    steps: list[int]
    values: list[float]
    markers: bool = False
    dropped: list[tuple[int, float]] = field(default_factory=list)

    @property
    def logged(self) -> bool:
        """Whether the records hold any point of it, drawable or not."""
        return bool(self.steps or self.dropped)


def _points(label: str, pairs: list[tuple[int, float | None]], markers: bool = False) -> Series:
    """A series of the pairs that hold a number, the non-finite ones set aside as dropped."""
    kept = [(s, v) for s, v in pairs if v is not None]
    drawn = [(s, v) for s, v in kept if math.isfinite(v)]
    return Series(label, [s for s, _ in drawn], [v for _, v in drawn], markers,
                  [(s, v) for s, v in kept if not math.isfinite(v)])


def series(records: list[dict[str, Any]], key: str, label: str, markers: bool = False) -> Series:
    """Steps and values of ``key`` over the records that carry a number for it."""
    return _points(label, [(r["step"], as_number(r.get(key))) for r in records], markers)


def max_vio_series(train: list[dict[str, Any]]) -> list[Series]:
    """One MaxVio line per MoE layer from the train records' ``moe_max_vio`` lists."""
    rows = [(r["step"], r["moe_max_vio"]) for r in train if isinstance(r.get("moe_max_vio"), list)]
    return [_points(f"MoE layer {j}", [(s, as_number(v[j])) for s, v in rows if j < len(v)])
            for j in range(max((len(v) for _, v in rows), default=0))]


def note_dropped(ax: Any, lines: list[Series]) -> None:
    """Say on the plot which series lost non-finite points (a diverged run's inf or nan
    loss): a curve that simply ends there would read as a run that stopped."""
    notes = [f"{s.label}: {len(s.dropped)} non-finite point{'s' if len(s.dropped) > 1 else ''} "
             f"not drawn (first {s.dropped[0][1]} at step {s.dropped[0][0]})"
             for s in lines if s.dropped]
    if notes:
        ax.text(0.01, 0.98, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=8,
                color="firebrick")


MOST_DRAWN = 2000  # points a line draws: past ~2 per pixel column they only blur into a band
MOST_MARKERS = 100  # markers past that: a plain line


def bucketed(steps: list[int], values: list[float], most: int = MOST_DRAWN
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean step, and mean, min and max value, of runs of `size` consecutive points, with at
    most `most` runs; and `size`. A million-step run's curve read as one solid band."""
    size = math.ceil(len(steps) / most)
    starts = np.arange(0, len(steps), size)
    x, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    counts = np.diff(np.append(starts, len(steps)))
    return (np.add.reduceat(x, starts) / counts, np.add.reduceat(y, starts) / counts,
            np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts), size)


def draw_line(ax: Any, s: Series, label: str, **style: Any) -> None:
    """One series: markers where asked or where it has one point (a one-point line draws
    nothing: a run killed after its first record); past MOST_DRAWN points, the mean of each
    bucket of points as the line, their min-max as a band around it (spikes stay seen)."""
    if len(s.steps) > MOST_DRAWN:
        x, mean, low, high, size = bucketed(s.steps, s.values)
        [line] = ax.plot(x, mean, "-", linewidth=1.4,
                         label=f"{label} (mean of each {size} records; band: their range)", **style)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    elif len(s.steps) == 1 or (s.markers and len(s.steps) <= MOST_MARKERS):
        ax.plot(s.steps, s.values, "o", markersize=5, label=label, **style)
    else:  # a thousand validations' markers would only overlap into a thick line
        ax.plot(s.steps, s.values, "-", linewidth=1.4, label=label, **style)


def draw_series(ax: Any, lines: list[Series]) -> None:
    """Each series (see `draw_line`), the steps' axis widened around a lone step."""
    for s in lines:
        draw_line(ax, s, s.label)
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
    note_dropped(ax, lines)
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
        if s.logged
    ]
    bpb = series(val, "val_bpb", "val bits/byte", markers=True)
    speed = series(train, "tokens_per_s", "tokens/s")
    lr = series(train, "lr", "learning rate")
    plans: dict[str, tuple[str, str, list[Series], tuple[float, str] | None]] = {}
    if loss:
        plans["loss"] = ("Loss", "loss (nats/token)", loss, None)
    if bpb.logged:
        # the baseline on the curve's own windows (periodic validation scores a part of the
        # split); runs from before Kiln logged it fall back to the whole split's, said so
        scored = [u for u in (as_number(r.get("val_unigram_bpb")) for r in val) if u is not None]
        base = ((scored[-1], f"unigram baseline {scored[-1]:.3f} (the same windows)") if scored
                else None if unigram_bpb is None
                else (unigram_bpb, f"unigram baseline {unigram_bpb:.3f} (the whole val split)"))
        plans["bpb"] = ("Validation bits per byte", "bits/byte", [bpb], base)
    if speed.logged:
        plans["throughput"] = ("Throughput", "tokens/s", [speed], None)
    if lr.logged:
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
