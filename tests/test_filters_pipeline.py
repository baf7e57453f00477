"""Every filter runs as a datatrove step under LocalPipelineExecutor, with exclusion writers,
and the two-pass perplexity selection works through files on disk."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from test_filters_perplexity import DOCS, run_dir  # noqa: F401  (module fixture)
from test_filters_quality import LATEX, PROSE, REPETITIVE

from kiln.data.filters import (
    EngagementFilter,
    PerplexityScorer,
    PerplexitySelector,
    SemanticQualityFilter,
    quality_filters,
    scores_from,
)


def n_words(text: str) -> int:
    return len(text.split())


def read_jsonl(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            rows += [json.loads(line) for line in f]
    return rows


def run(pipeline, logs: Path):
    return LocalPipelineExecutor(pipeline, tasks=1, workers=1, logging_dir=str(logs),
                                 skip_completed=False).run()


def test_quality_and_brain_rot_filters_in_local_executor(tmp_path):
    engagement = dict(likes=900, retweets=0, replies=0, quotes=0)
    docs = [
        Document(PROSE, "prose", metadata=dict(engagement, likes=3)),
        Document(REPETITIVE, "repetitive", metadata=dict(engagement, likes=3)),
        Document(LATEX, "latex", metadata=dict(engagement, likes=3)),
        Document("SHOCKING!!! You won't believe this #viral", "junk", metadata=engagement),
    ]
    removed = tmp_path / "removed"
    pipeline = [
        docs,
        EngagementFilter(length=n_words, exclusion_writer=JsonlWriter(str(removed / "m1"))),
        SemanticQualityFilter(mode="tag"),
        *quality_filters("prose", lambda name: JsonlWriter(str(removed / name))),
        JsonlWriter(str(tmp_path / "kept")),
    ]
    stats = run(pipeline, tmp_path / "logs")
    kept = read_jsonl(tmp_path / "kept")
    assert [r["id"] for r in kept] == ["prose"]
    assert kept[0]["metadata"]["m2_label"] == "high_quality"
    assert kept[0]["metadata"]["m1_class"] == "control"  # > 100 words, 3 likes
    m1 = read_jsonl(removed / "m1")
    assert [(r["id"], r["metadata"]["filter_reason"]) for r in m1] == [("junk", "m1_junk")]
    rep = read_jsonl(removed / "gopher_repetition")
    assert [(r["id"], r["metadata"]["filter_reason"]) for r in rep] == [("repetitive", "dup_line_frac")]
    quality = read_jsonl(removed / "gopher_quality")
    assert [r["id"] for r in quality] == ["latex"]
    m1_stats = {k: int(v.total) for k, v in stats.stats[0].stats.items()}  # datatrove counters
    assert m1_stats["dropped"] == 1 and m1_stats["dropped_m1_junk"] == 1 and m1_stats["m1_junk"] == 1


def test_two_pass_perplexity_selection_through_files(tmp_path, run_dir):  # noqa: F811
    run_path, _, _ = run_dir
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(DOCS * 2)]
    run([docs, PerplexityScorer(run_path, batch_size=3), JsonlWriter(str(tmp_path / "scored"))],
        tmp_path / "logs1")
    scored = JsonlReader(str(tmp_path / "scored"))
    scores = scores_from(scored.run(None, 0, 1))
    assert len(scores) == 8 and len(set(scores)) == 4  # duplicated texts tie in pairs
    selector = PerplexitySelector("top_fraction", fraction=0.25, scores=scores)
    run([JsonlReader(str(tmp_path / "scored")), selector, JsonlWriter(str(tmp_path / "selected"))],
        tmp_path / "logs2")
    kept = read_jsonl(tmp_path / "selected")
    assert len(kept) == 2  # the top 2 of 8 are one tied pair: both copies of the max
    assert {r["metadata"]["ppl"] for r in kept} == {max(scores)}
