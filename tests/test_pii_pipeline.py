"""PIIRedactor runs as a datatrove step under LocalPipelineExecutor, with counts in metadata/stats."""

from __future__ import annotations

import gzip
import json

from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.writers import JsonlWriter

from kiln.data.pii import PII_TYPES, PIIRedactor, redact

DOCS = [
    "Author: Jane Doe <jane.doe@gmail.com>\nserver 52.14.200.9\n",
    'DB_PASSWORD=Tr0ub4dor&3\napi_key = "a8f5f167f44f4964e6c998dee827110c"\n',
    "def f():\n    return 1  # nothing personal here\n",
]


def test_pii_redactor_under_local_executor(tmp_path):
    out_dir = tmp_path / "out"
    pipeline = [
        [Document(text=t, id=str(i)) for i, t in enumerate(DOCS)],
        PIIRedactor(),
        JsonlWriter(str(out_dir), output_filename="redacted.jsonl.gz"),
    ]
    LocalPipelineExecutor(pipeline, tasks=1, workers=1, logging_dir=str(tmp_path / "logs")).run()

    with gzip.open(out_dir / "redacted.jsonl.gz", "rt") as f:
        rows = {r["id"]: r for r in map(json.loads, f)}
    for i, text in enumerate(DOCS):
        expected_text, expected_counts = redact(text)
        assert rows[str(i)]["text"] == expected_text
        assert rows[str(i)]["metadata"]["pii"] == expected_counts
    assert rows["0"]["metadata"]["pii"]["EMAIL"] == 1 and rows["1"]["metadata"]["pii"]["KEY"] == 1
    assert set(rows["2"]["metadata"]["pii"]) == set(PII_TYPES)

    stats = json.loads((tmp_path / "logs" / "stats.json").read_text())
    raw = next(s for s in stats if "PII" in s["name"])["stats"]
    # datatrove stores a stat seen once as a plain number, otherwise as a summary with "total"
    redactor = {k: v["total"] if isinstance(v, dict) else v for k, v in raw.items()}
    assert redactor["pii_email"] == 1 and redactor["pii_password"] == 1 and redactor["pii_key"] == 1
    assert redactor["pii_docs_with_ip_address"] == 1 and redactor["total"] == 3
    assert "pii_username" not in redactor


def test_pii_redactor_type_subset_and_bad_type():
    step = PIIRedactor(types=["EMAIL"])
    (doc,) = step.run([Document(text="a jane@gmail.com 8.8.8.8", id="x")])
    assert doc.text == "a <EMAIL> 8.8.8.8" and doc.metadata["pii"] == {"EMAIL": 1}
    try:
        PIIRedactor(types=["PHONE"])
    except ValueError as e:
        assert "PHONE" in str(e)
    else:
        raise AssertionError("unknown type accepted")
