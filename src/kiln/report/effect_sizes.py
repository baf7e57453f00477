"""Hedges' g between compared runs' held-out losses (`kiln report --compare`): each run's
per-window losses from its last `kiln eval` (`kiln.eval.window_losses`), the report's own
run against each --compare run, |g| > 0.3 flagged as non-trivial (papers/brain-rot.md's
"health check"; `kiln.eval.effect_size`).

g is only computed where the two evals scored the same windows: the same split of the same
token shards (eval.json's `split_sha256`), the same window length and the same number of
windows. Otherwise the section says why there is none: losses on other text differ for
reasons that are not the models'. g treats the windows as two independent samples, as the
paper's arms are; they are in fact paired (the same windows), so beside g stand the paired
figures: the mean per-window difference with its 95% paired-t interval, and d_z
(`kiln.eval.effect_size.paired_difference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.eval.effect_size import CONFIDENCE, NON_TRIVIAL_G, hedges_g, paired_difference
from kiln.eval.window_losses import read_window_losses
from kiln.report.fmt import fmt_count, fmt_float
from kiln.report.html_parts import grid_table, paragraph
from kiln.report.run_files import load_json

COLUMNS = ["run", "against", "windows", "mean loss (run)", "mean loss (against)",
           f"mean difference [{CONFIDENCE:.0%} CI]", "d_z", "Hedges' g", "verdict"]
DIFF, G, VERDICT = 5, 7, 8  # the paired difference's, g's and the verdict's columns


@dataclass
class WindowLosses:
    """One run's per-window eval losses and what they were scored on, or why there are none."""

    losses: np.ndarray | None = None
    scored_on: tuple | None = None  # (split, split_sha256, seq_len)
    problem: str | None = None


def load_window_losses(run_dir: Path) -> WindowLosses:
    """`run_dir`'s per-window losses (never raises: a problem is kept to be shown)."""
    evaluation = load_json(run_dir, "eval.json")
    if not evaluation.ok:
        return WindowLosses(problem=f"{evaluation.problem}: run `kiln eval {run_dir}`")
    data = evaluation.value
    try:
        losses = read_window_losses(run_dir, data)
    except (ValueError, OSError) as e:
        return WindowLosses(problem=str(e))
    bad = int(np.count_nonzero(~np.isfinite(losses)))
    if bad:  # named here, by run: g's own error says "the first sample" or "the second"
        return WindowLosses(problem=f"{bad:,} of its {len(losses):,} per-window losses are "
                                    "not finite (NaN or inf)")
    digest = data.get("split_sha256")  # a hex text: any other value records none
    return WindowLosses(losses, (data.get("split"), digest if isinstance(digest, str) else None,
                                 data.get("seq_len")))


def _unpaired(a: WindowLosses, b: WindowLosses) -> str | None:
    """Why `a` and `b` were not scored on the same windows (None: they were)."""
    if a.scored_on is None or b.scored_on is None:
        return "no per-window losses"
    (split_a, hash_a, len_a), (split_b, hash_b, len_b) = a.scored_on, b.scored_on
    if hash_a is None or hash_b is None:
        return ("the token shards do not record their hashes (re-run `kiln tokenize`), so "
                "the same held-out split cannot be confirmed")
    if split_a != split_b or hash_a != hash_b:
        return (f"not the same held-out split ({split_a} {hash_a[:12]}… vs {split_b} "
                f"{hash_b[:12]}…: other documents, another split or another tokenizer)")
    if len_a != len_b:
        return f"other windows ({len_a} vs {len_b} tokens)"
    if len(a.losses) != len(b.losses):  # type: ignore[arg-type]
        return (f"other windows ({len(a.losses)} vs {len(b.losses)}: "  # type: ignore[arg-type]
                "eval.max_batches or eval.batch_size differ)")
    return None


def effect_size_rows(labels: list[str], runs: list[WindowLosses]) -> tuple[list[list[str]],
                                                                           list[str]]:
    """One table row per --compare run (g of its windows' losses against the report's own
    run's, and the paired figures of its windows' losses minus the own run's: positive =
    higher loss than the own run), and a note for each pair with none."""
    rows, notes = [], []
    own, own_label = runs[0], labels[0]
    for label, run in zip(labels[1:], runs[1:]):
        problem = next((f"{lab}: {r.problem}" for lab, r in ((own_label, own), (label, run))
                        if r.problem), None) or _unpaired(run, own)
        if problem is None:
            try:
                g = hedges_g(run.losses.tolist(), own.losses.tolist())  # type: ignore[union-attr]
                paired = paired_difference(run.losses, own.losses)  # type: ignore[arg-type]
            except ValueError as e:
                problem = str(e)
        if problem is not None:
            notes.append(f"No Hedges' g for {label} against {own_label}: {problem}.")
            continue
        verdict = (("non-trivial: higher loss" if g > 0 else "non-trivial: lower loss")
                   if abs(g) > NON_TRIVIAL_G else "trivial")
        rows.append([label, own_label, fmt_count(paired.n),
                     fmt_float(float(run.losses.mean())),  # type: ignore[union-attr]
                     fmt_float(float(own.losses.mean())),  # type: ignore[union-attr]
                     f"{paired.mean:+.4f} [{paired.low:+.4f}, {paired.high:+.4f}]",
                     "— (differences all equal)" if paired.d_z is None
                     else f"{paired.d_z:+.3f}",
                     f"{g:+.3f}", verdict])
    return rows, notes


def summary_line(row: list[str]) -> str:
    """A table row as the one line `kiln report` prints for it."""
    return (f"{row[0]} against {row[1]} over {row[2]} windows: "
            f"Hedges' g {row[G]} ({row[VERDICT]}); paired mean loss difference "
            f"[{CONFIDENCE:.0%} CI] {row[DIFF]} nats, d_z {row[DIFF + 1]}")


def effect_size_html(labels: list[str], runs: list[WindowLosses],
                     ) -> tuple[str, list[str], list[str]]:
    """The section's HTML, an alert for each run whose windows have a non-trivially higher
    loss (the health check's "bad direction"), for the console too, and each pair's
    figures on one line (`summary_line`) for the console."""
    rows, notes = effect_size_rows(labels, runs)
    alerts = [f"{row[0]}'s held-out windows have a non-trivially higher loss than {row[1]}'s "
              f"(Hedges' g {row[G]}, past {NON_TRIVIAL_G}; paired mean difference "
              f"[{CONFIDENCE:.0%} CI] {row[DIFF]} nats)"
              for row in rows if row[VERDICT] == "non-trivial: higher loss"]
    body = "".join(paragraph(n, "missing") for n in notes)
    if rows:
        body += grid_table(COLUMNS, rows) + paragraph(
            "Hedges' g of the per-window held-out losses of the last `kiln eval` of each run "
            f"(pooled SD, small-sample correction, as papers/brain-rot.md); |g| > "
            f"{NON_TRIVIAL_G} is flagged as non-trivial. g takes the windows as two "
            "independent samples; they are the same windows, so beside it: the mean "
            f"per-window loss difference (nats) with its {CONFIDENCE:.0%} paired-t interval, "
            "and d_z = that mean / the SD of the differences. Positive: the run's windows "
            "have the higher loss.", "muted")
    return body, alerts, [summary_line(row) for row in rows]
