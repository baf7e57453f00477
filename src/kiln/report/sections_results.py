"""Report sections that show what the run produced: curves, evaluation, samples."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kiln.eval import perplexity_of, perplexity_text
from kiln.report.fmt import as_number, fmt_bytes, fmt_count, fmt_float, fmt_value
from kiln.report.html_parts import esc, image, key_value_table, paragraph, section, unavailable
from kiln.report.run_files import Loaded

PLOT_TITLES = {
    "loss": ("Loss", "no train or val loss in metrics.jsonl"),
    "bpb": ("Validation bits per byte", "no val records in metrics.jsonl"),
    "throughput": ("Throughput", "no tokens_per_s in metrics.jsonl"),
    "lr": ("Learning rate", "no lr in metrics.jsonl"),
}


def plots_section(metrics: Loaded, plots: dict[str, Path]) -> str:
    """Every curve, or why each one is absent."""
    if not metrics.ok:
        return section("Training curves", unavailable(metrics.problem or ""))
    parts = []
    for name, (title, why_absent) in PLOT_TITLES.items():
        body = image(f"plots/{name}.png", title) if name in plots else unavailable(why_absent)
        parts.append(f"<h3>{esc(title)}</h3>\n{body}")
    return section("Training curves", "\n".join(parts))


def verdict(bpb: float | None, unigram: float | None) -> tuple[str, str]:
    """Sentence and CSS class saying whether the model beats the unigram baseline."""
    if bpb is None:
        return "No bits-per-byte figure to compare.", "muted"
    if not math.isfinite(bpb):
        return (f"Bits per byte are {bpb}: the model's outputs are not finite (training "
                "diverged?).", "bad")
    if unigram is None:
        return f"bpb {bpb:.4f}; no unigram baseline to compare against.", "muted"
    gap = unigram - bpb
    if gap > 0:
        return (
            f"Beats the unigram baseline: {bpb:.4f} < {unigram:.4f} bits/byte (by {gap:.4f}).",
            "good",
        )
    return (
        f"Does NOT beat the unigram baseline: {bpb:.4f} >= {unigram:.4f} bits/byte "
        f"(behind by {-gap:.4f}).",
        "bad",
    )


def eval_section(evaluation: Loaded, index_unigram: float | None,
                 latest: str | None = None) -> str:
    """Loss, perplexity and bpb on the held-out split, against the unigram baseline; says so
    when they come from an older checkpoint than the run's `latest`."""
    if not evaluation.ok:
        return section("Evaluation", unavailable(evaluation.problem or ""))
    data: dict[str, Any] = evaluation.value
    split = data.get("split", "val")
    scored = as_number(data.get("unigram_bpb_scored"))
    unigram = as_number(data.get("unigram_bpb"))
    unigram = index_unigram if unigram is None else unigram
    partial = bool(data.get("max_batches"))
    rows = [
        ("split", fmt_value(split)),
        ("checkpoint", fmt_value(data.get("checkpoint", "—"))),
        ("loss", fmt_float(data.get("loss"))),
        ("perplexity", _perplexity_cell(data)),
        ("bpb", fmt_float(data.get("bpb"))),
        ("tokens", fmt_count(data.get("tokens"))),
        ("bytes", fmt_bytes(data.get("bytes"))
         + (f" ({data['bytes_counted']})" if data.get("bytes_counted", "exact") != "exact" else "")),
        ("unigram baseline bpb (the same tokens)", fmt_float(scored)) if scored is not None
        else ("unigram baseline bpb (the whole val split)", fmt_float(unigram)),
    ]
    rows += _concentration_rows(data.get("next_token"))
    if "seq_len" in data:  # recorded since eval could score other windows than trained on
        rows.insert(2, ("window (tokens), precision",
                        f"{fmt_value(data['seq_len'])}, {fmt_value(data.get('precision', '—'))}"))
    if scored is not None:  # measured on exactly the tokens scored: always comparable
        text, css = verdict(as_number(data.get("bpb")), scored)
    elif split == "val" and not partial:
        text, css = verdict(as_number(data.get("bpb")), unigram)
    else:  # the whole val split's baseline: not comparable to a part, or to the train split
        what = f"the first {_batches(data['max_batches'])} of the" if partial else "the"
        text, css = (f"Evaluated on {what} {split} split; the unigram baseline is the whole val "
                     "split's, so the two are not compared (`kiln tokenize` again records "
                     "what the baseline needs to score the same tokens).", "muted")
    body = key_value_table(rows) + paragraph(text, css)
    body += stale_note(data.get("checkpoint"), latest, "These figures", "kiln eval")
    if "max_batches" in data:  # recorded since Kiln counted exact bytes
        body += paragraph("The validation curve above scores the first train.eval_batches "
                          "batches of the val split; this table scores "
                          + (f"all of the {split} split." if not partial else
                             f"the first {_batches(data['max_batches'])} of the {split} split."),
                          "muted")
    return section("Evaluation", body)


# eval.json's "next_token" figures (`kiln.eval.concentration`), as the report labels them
CONCENTRATION_LABELS = (
    ("top1_prob", "next-token top-1 probability (mean)"),
    ("top5_mass", "next-token top-5 mass (mean)"),
    ("top10_mass", "next-token top-10 mass (mean)"),
    ("k90", "next-token tokens to 90% mass (mean)"),
    ("top100_entropy", "next-token top-100 entropy, renormalised (nats, mean)"),
    ("entropy", "next-token entropy (nats, mean)"),
)


def _concentration_rows(figures: Any) -> list[tuple[str, str]]:
    """Rows for eval.json's next-token concentration; none for an eval from before Kiln took
    it (or a value not a dict: shown as missing, never a crash)."""
    if not isinstance(figures, dict):
        return []
    rows = [(label, fmt_float(figures.get(key), 1 if key == "k90" else 4))
            for key, label in CONCENTRATION_LABELS]
    ids = figures.get("tokenizer_ids")  # recorded since they leave a padded vocabulary's out
    if ids is not None:
        rows.append(("next-token figures over", f"the tokenizer's "
                     f"{f'{ids:,}' if isinstance(ids, int) else fmt_value(ids)} ids (renormalised)"))
    return rows


def _perplexity_cell(data: dict[str, Any]) -> str:
    """eval.json's perplexity; for a loss past 700 the loss's own, as eval.json files from
    before Kiln wrote inf hold exp(700) there, which reads as a real figure."""
    loss, value = as_number(data.get("loss")), as_number(data.get("perplexity"))
    if loss is not None and loss > 700:
        value = perplexity_of(loss)
    return fmt_float(data.get("perplexity")) if value is None else perplexity_text(value)


def _batches(n: int) -> str:
    return "batch" if n == 1 else f"{n} batches"


def stale_note(checkpoint: Any, latest: str | None, what: str, verb: str) -> str:
    """A warning paragraph when `what` came from an older checkpoint than the run's latest."""
    if not (latest and checkpoint and checkpoint != latest):
        return ""
    return paragraph(f"{what} are from {checkpoint}; the run's latest checkpoint is {latest}: "
                     f"run `{verb}` again for its own.", "bad")


def _sample_html(number: int, sample: Any) -> str:
    if not isinstance(sample, dict):
        return f"<h3>Sample {number}</h3>\n<pre>{esc(sample)}</pre>"
    # greedy decoding uses neither top_k nor top_p (older samples.json files list them)
    if sample.get("decoding") == "greedy" or as_number(sample.get("temperature")) == 0:
        knobs = "greedy"
    else:
        knobs = ", ".join(
            f"{k} {fmt_value(sample[k])}" for k in ("temperature", "top_k", "top_p") if k in sample
        )
    head = f"Sample {number}" + (f" — {knobs}" if knobs else "")
    prompt, completion = str(sample.get("prompt", "")), str(sample.get("completion", ""))
    cut = as_number(sample.get("incomplete_bytes_dropped"))
    bytes_are = "byte (an incomplete UTF-8 character) is" if cut == 1 else \
        "bytes (an incomplete UTF-8 character) are"
    note = (paragraph(f"The sample stopped inside a character: its last {fmt_value(cut)} "
                      f"{bytes_are} left out.", "muted")
            if cut else "")
    return f"<h3>{esc(head)}</h3>\n<pre><b>{esc(prompt)}</b>{esc(completion)}</pre>{note}"


def samples_section(samples: Loaded, latest: str | None = None) -> str:
    """Generated text; the prompt in bold, the completion after it; says so when the samples
    come from an older checkpoint than the run's `latest`."""
    if not samples.ok:
        return section("Samples", unavailable(samples.problem or ""))
    if not samples.value:
        return section("Samples", unavailable("samples.json is empty"))
    body = "\n".join(_sample_html(i, s) for i, s in enumerate(samples.value, start=1))
    # a checkpoint name is text: another JSON value (a list, by hand) names none, not a crash
    sources = {c for s in samples.value if isinstance(s, dict)
               and isinstance(c := s.get("checkpoint"), str)}
    if len(sources) == 1:
        body = stale_note(sources.pop(), latest, "These samples", "kiln generate") + body
    return section("Samples", body)


def export_section(record: Loaded, latest: str | None = None, exported: bool = False) -> str:
    """Which format export/ holds and the checkpoint it came from (`exported`: export/ holds
    a model's weights or config, perhaps written before Kiln recorded either). A record
    there but unreadable, or an export/ with no model in it, is said as such: both read as
    a model exported before Kiln recorded its checkpoint."""
    if not record.ok:
        if exported and record.problem == f"{record.name} missing":
            return section("Export", paragraph("export/ holds a model exported before Kiln "
                                               "recorded its checkpoint; run `kiln export` "
                                               "again to know which it is.", "muted"))
        return section("Export", unavailable(record.problem or ""))
    data: dict[str, Any] = record.value
    rows = [("format", fmt_value(data.get("format", "—"))),
            ("checkpoint", fmt_value(data.get("checkpoint") or "—")),
            ("folder", "export/")]
    body = key_value_table(rows)
    body += stale_note(data.get("checkpoint"), latest, "The exported weights", "kiln export")
    return section("Export", body)
