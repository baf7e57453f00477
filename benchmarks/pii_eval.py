"""Per-type precision/recall of kiln's PII detector on the labelled set (tests/fixtures/pii).

Peer measured in the same run: datatrove's PIIFormatter patterns as it applies them (emails;
public IPv4 only), scored on the two types it covers. Matching is span-level, one-to-one within a
type; "overlap" (the target metric) and "exact" boundaries are both printed.

Run: .venv/bin/python benchmarks/pii_eval.py [--errors]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from datatrove.pipeline.formatters.pii import PIIFormatter

from kiln.data.pii import PII_TYPES, Span, detect_pii
from kiln.data.pii.scoring import load_labelled, score

LABELLED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pii" / "labelled.jsonl"
TARGET_RECALL, TARGET_PRECISION = 0.95, 0.90


def datatrove_peer(text: str) -> list[Span]:
    """The spans datatrove's PIIFormatter would replace (it reports none, so re-run its regexes)."""
    fmt = PIIFormatter()
    spans = [Span("EMAIL", m.start(), m.end(), m.group(0))
             for m in fmt.emails_replacer.regex.finditer(text)]
    spans += [Span("IP_ADDRESS", m.start(), m.end(), m.group(0))
              for m in fmt.ip_replacer.regex.finditer(text) if fmt.ip_replacer.validator(m.group(0))]
    return spans


def table(title: str, scores: dict) -> None:
    print(f"\n{title}\n{'type':<11} {'P':>6} {'R':>6} {'tp':>5} {'fp':>5} {'fn':>5}")
    for t, s in scores.items():
        print(f"{t:<11} {s.precision:6.3f} {s.recall:6.3f} {s.tp:5d} {s.fp:5d} {s.fn:5d}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--errors", action="store_true", help="list every false positive/negative")
    args = ap.parse_args()
    rows = load_labelled(LABELLED)
    hand = [r for r in rows if r["source"] == "hand"]
    n_gold = {t: sum(s["type"] == t for r in rows for s in r["spans"]) for t in PII_TYPES}
    print(f"{len(rows)} rows ({len(hand)} hand-written); gold spans per type: {n_gold}")

    overlap = score(rows, detect_pii)
    table("kiln, all rows, overlap match (target metric)", overlap)
    table("kiln, all rows, exact match", score(rows, detect_pii, exact=True))
    table("kiln, hand-written rows only, overlap match", score(hand, detect_pii))
    holdout = [r for r in rows if r["source"] == "hand-holdout"]
    table("kiln, held-out hand-written rows (written after tuning, never tuned on), overlap",
          score(holdout, detect_pii))
    peer_types = ("EMAIL", "IP_ADDRESS")
    peer = score(rows, datatrove_peer, types=peer_types)
    table("peer: datatrove PIIFormatter patterns, overlap match", peer)
    if args.errors:
        for t, s in overlap.items():
            for e in s.errors:
                print(f"{t:<11} {e}")

    ok = all(s.recall >= TARGET_RECALL and s.precision >= TARGET_PRECISION for s in overlap.values())
    fields = [f"{t.lower()}_p={s.precision:.3f} {t.lower()}_r={s.recall:.3f}" for t, s in overlap.items()]
    ratios = [f"{t.lower()}_f1_vs_datatrove={_f1(overlap[t]) / max(_f1(peer[t]), 1e-9):.3f}"
              for t in peer_types]
    print(f"\ntargets (P>={TARGET_PRECISION}, R>={TARGET_RECALL} per type) met: {ok}")
    print("RESULT " + " ".join(fields + ratios) + f" targets_met={int(ok)}")


def _f1(s) -> float:
    return 2 * s.precision * s.recall / (s.precision + s.recall) if s.precision + s.recall else 0.0


if __name__ == "__main__":
    main()
