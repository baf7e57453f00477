"""The mixture-of-experts section: expert load balance (MaxVio) per MoE layer over training.

MaxVio = (max_i n_i - mean n) / mean n over the tokens routed to each expert (DeepSeek /
Trinity's imbalance figure; 0 is perfect balance, n_experts / top_k - 1 is every token on
the same experts). The trainer logs one value per MoE layer in ``moe_max_vio``; dense runs
have none and get no section.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from kiln.report.fmt import as_number, fmt_float
from kiln.report.html_parts import grid_table, image, paragraph, section, unavailable
from kiln.report.metrics_io import records_of_kind
from kiln.report.run_files import Loaded

MOE_PLOT = "moe_max_vio"


def _dense_prefix(config: Loaded) -> int:
    """model.n_dense_layers from the run's config.toml (MoE layers follow it), else 0."""
    if not config.ok:
        return 0
    try:
        model = tomllib.loads(config.value).get("model", {})
    except tomllib.TOMLDecodeError:
        return 0
    # a `model` that is not a table (config.toml edited by hand) failed the whole report
    value = model.get("n_dense_layers", 0) if isinstance(model, dict) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def max_vio_rows(records: list[dict[str, Any]]) -> list[list[float | None]]:
    """The per-layer MaxVio lists of the train records, in step order."""
    return [r["moe_max_vio"] for r in records_of_kind(records, "train")
            if isinstance(r.get("moe_max_vio"), list)]


def moe_section(records: list[dict[str, Any]], plots: dict[str, Path], config: Loaded) -> str | None:
    """Plot and final per-layer MaxVio, or None for a run without MoE records."""
    rows = max_vio_rows(records)
    if not rows:
        return None
    dense = _dense_prefix(config)
    tail = rows[-max(1, len(rows) // 4):]
    table = []
    for j in range(max(len(r) for r in rows)):
        final = as_number(rows[-1][j]) if j < len(rows[-1]) else None
        recent = [v for v in (as_number(r[j]) for r in tail if j < len(r)) if v is not None]
        mean = sum(recent) / len(recent) if recent else None
        table.append([f"MoE layer {j}", str(dense + j), fmt_float(final, 3), fmt_float(mean, 3)])
    plot = (image(f"plots/{MOE_PLOT}.png", "MaxVio per MoE layer over steps") if MOE_PLOT in plots
            else unavailable("no MaxVio plot"))
    note = paragraph("MaxVio = (max expert load - mean load) / mean load, per MoE layer, from "
                     "the last logged step's batch; 'last quarter' averages the last quarter of "
                     "the logged steps. 0 is perfect balance.", "muted")
    headers = ["layer", "block", "final MaxVio", "mean MaxVio (last quarter)"]
    return section("Mixture of experts: load balance",
                   plot + grid_table(headers, table) + note + _load_table(records, dense))


def _load_table(records: list[dict[str, Any]], dense: int) -> str:
    """Each MoE layer's share of routed tokens per expert at the last logged step."""
    loads = [r["moe_load"] for r in records_of_kind(records, "train")
             if isinstance(r.get("moe_load"), list)]
    if not loads:
        return ""
    last = [layer if isinstance(layer, list) else [] for layer in loads[-1]]
    n = max(map(len, last), default=0)
    if not n:
        return ""
    rows = [[f"MoE layer {j} (block {dense + j})", *map(_share, layer)]
            for j, layer in enumerate(last)]
    return (paragraph("Expert load (share of routed tokens, last logged step); uniform is "
                      f"{100 / n:.1f}% per expert.", "muted")
            + grid_table(["layer", *(f"e{i}" for i in range(n))], rows))


def _share(value: Any) -> str:
    """An expert's share as a percentage; a nan or inf as itself, anything else as a dash
    (a file's null: an older Kiln wrote a non-finite float in a list so)."""
    share = as_number(value)
    if share is None:
        return "—"
    return f"{100 * share:.1f}%" if math.isfinite(share) else str(share)
