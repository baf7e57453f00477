"""Redaction: typed placeholders, per-type counts, idempotence, and quality on the labelled set."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kiln.data.pii import PII_TYPES, detect_pii, redact
from kiln.data.pii.scoring import load_labelled, score

FIXTURES = Path(__file__).parent / "fixtures" / "pii"
SAMPLE = """Author: Jane Doe <jane.doe@gmail.com>
password = "xK9#mq2Lv"  # user=rsingh
server 52.14.200.9 AKIAQ3EGRZ7XJ5KMN2PB cc @octocat /home/mkowalski/x
version = "1.2.3.4"; backup 52.14.200.10
"""


def test_redact_replaces_each_type_with_its_placeholder_and_counts():
    out, counts = redact(SAMPLE)
    assert out == """Author: <NAME> <<EMAIL>>
password = "<PASSWORD>"  # user=<USERNAME>
server <IP_ADDRESS> <KEY> cc @<USERNAME> /home/<USERNAME>/x
version = "1.2.3.4"; backup <IP_ADDRESS>
"""
    assert counts == {"KEY": 1, "USERNAME": 3, "EMAIL": 1, "PASSWORD": 1, "NAME": 1, "IP_ADDRESS": 2}
    # counts agree with the number of placeholders in the output
    assert all(out.count(f"<{t}>") == n for t, n in counts.items())


def test_redact_subset_of_types_leaves_the_rest():
    out, counts = redact(SAMPLE, types=["EMAIL", "IP_ADDRESS"])
    assert "Jane Doe" in out and "rsingh" in out and "<EMAIL>" in out and "52.14.200.9" not in out
    assert counts == {"EMAIL": 1, "IP_ADDRESS": 2} | {t: 0 for t in PII_TYPES if t not in
                                                      ("EMAIL", "IP_ADDRESS")}


def test_redaction_is_idempotent_on_every_labelled_row():
    for row in load_labelled(FIXTURES / "labelled.jsonl"):
        once, _ = redact(row["text"])
        twice, counts = redact(once)
        assert twice == once, row["id"]
        assert sum(counts.values()) == 0, row["id"]


def test_no_pii_means_text_unchanged():
    text = "def add(a, b):\n    return a + b  # version 1.2.3.4\n"
    assert redact(text) == (text, dict.fromkeys(PII_TYPES, 0))


def test_labelled_set_is_reproducible_from_generator():
    spec = importlib.util.spec_from_file_location("pii_generate", FIXTURES / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    stored = [json.loads(line) for line in (FIXTURES / "labelled.jsonl").read_text().splitlines()]
    assert gen.build() == stored
    for pii_type in PII_TYPES:
        assert sum(s["type"] == pii_type for r in stored for s in r["spans"]) >= 60, pii_type
    for row in stored:
        for s in row["spans"]:
            assert not row["text"][s["start"]:s["end"]].isspace()


def test_per_type_quality_meets_targets_on_labelled_set():
    rows = load_labelled(FIXTURES / "labelled.jsonl")
    scores = score(rows, detect_pii)
    report = {t: (round(s.precision, 3), round(s.recall, 3)) for t, s in scores.items()}
    for pii_type, s in scores.items():
        assert s.recall >= 0.95, (pii_type, report, s.errors[:10])
        assert s.precision >= 0.90, (pii_type, report, s.errors[:10])


def test_scoring_counts_a_known_case():
    row = {"id": "r", "text": "mail a@gmail.com and 8.8.8.8",
           "spans": [{"type": "EMAIL", "start": 5, "end": 16}, {"type": "NAME", "start": 0, "end": 4}]}
    scores = score([row], detect_pii)
    assert (scores["EMAIL"].tp, scores["EMAIL"].fp, scores["EMAIL"].fn) == (1, 0, 0)
    assert (scores["NAME"].tp, scores["NAME"].fn) == (0, 1)
    assert (scores["IP_ADDRESS"].fp, scores["IP_ADDRESS"].precision) == (1, 0.0)


def test_load_labelled_rejects_bad_spans(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "text": "abc", "spans": [{"type": "KEY", "start": 2, "end": 9}]}))
    with pytest.raises(ValueError, match="bad span"):
        load_labelled(bad)
