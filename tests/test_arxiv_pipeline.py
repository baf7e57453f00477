"""arXiv steps end to end: metadata table, the digest's 6-archive yield test, the local executor."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

from kiln.data.arxiv import (
    ArxivMetadataFilter,
    ArxivSourceReader,
    LatexToText,
    archive_stem,
    find_source_archive,
    metadata_drop_reason,
)

FIXTURES = Path(__file__).parent / "fixtures" / "latex"
WORDS20 = " ".join(f"w{i}" for i in range(20))
PAPER = "\\documentclass{article}\\begin{document}\\section{S}Body text number %d.\\end{document}"


def record(**over) -> dict:
    base = {"id": "2101.00001", "categories": "hep-th", "abstract": WORDS20, "comments": "",
            "title": "T", "versions": [{"created": "Mon, 4 Jan 2021 10:00:00 GMT"}]}
    return {**base, **over}


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({}, None),
        ({"categories": "astro-ph.GA"}, "category"),
        ({"categories": "astro-ph math.CO"}, None),
        ({"categories": "math-ph"}, "category"),
        ({"categories": "stat.ML"}, None),
        ({"categories": "stat.AP"}, "category"),
        ({"abstract": " ".join(WORDS20.split()[:19])}, "abstract_short"),
        ({"versions": [{"created": "Fri, 30 Dec 1994 10:00:00 GMT"}]}, "year"),
        ({"versions": [{"created": "Mon, 2 Jan 1995 10:00:00 GMT"}]}, None),
        ({"comments": "This paper has been Withdrawn by the author"}, "withdrawn"),
        ({"id": None}, "bad_record"),
    ],
)
def test_metadata_filter_table(over, reason):
    assert metadata_drop_reason(record(**over)) == reason


def test_ids_map_to_archive_files(tmp_path):
    assert archive_stem("2101.00001v3") == ("2101", "2101.00001")
    assert archive_stem("hep-th/9901001") == ("9901", "hep-th9901001")
    assert archive_stem("math.CO/0501001") == ("0501", "math0501001")
    (tmp_path / "9901").mkdir()
    (tmp_path / "9901" / "hep-th9901001.gz").write_bytes(b"x")
    (tmp_path / "2101.00001.tar.gz").write_bytes(b"x")
    assert find_source_archive(tmp_path, "hep-th/9901001").name == "hep-th9901001.gz"
    assert find_source_archive(tmp_path, "2101.00001").name == "2101.00001.tar.gz"
    assert find_source_archive(tmp_path, "2101.00002") is None
    with pytest.raises(ValueError, match="not an arXiv id"):
        archive_stem("../../etc/passwd")


def tar_gz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def six_archives(folder: Path) -> None:
    """The digest's yield test: 2 written (tar, gzip), 1 invalid, 2 empty_tex, 1 duplicate (a
    copy of the tar: dropped by prepare's dedup_exact stage, see test_prepare_recipes.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    valid = tar_gz({"main.tex": PAPER % 1 + "\n", "sec.tex": "\\section{Extra} More text."})
    (folder / "1001.00001.tar.gz").write_bytes(valid)
    (folder / "1001.00002.tar.gz").write_bytes(valid[: len(valid) // 2])  # corrupt
    (folder / "1001.00003.tar.gz").write_bytes(tar_gz({"fig.eps": "%!PS", "README": "x"}))
    (folder / "1001.00004.gz").write_bytes(gzip.compress((PAPER % 4).encode()))
    (folder / "1001.00005").write_bytes(b"Just notes, \\emph{no} document class.")
    (folder / "1001.00006.tar.gz").write_bytes(valid)


def run_pipeline(steps, tmp_path: Path) -> tuple[list[dict], dict[str, int]]:
    out = tmp_path / "out"
    executor = LocalPipelineExecutor(
        [*steps, JsonlWriter(str(out))], tasks=1, workers=1,
        logging_dir=str(tmp_path / "logs"), skip_completed=False,
    )
    stats = executor.run()
    counts: dict[str, int] = {}
    for step in stats.stats:
        for key, value in step.stats.items():
            counts[key] = counts.get(key, 0) + int(value.total)
    docs = [d for d in JsonlReader(str(out)).run(None, 0, 1)]
    return [{"id": d.id, "text": d.text, **d.metadata} for d in docs], counts


def prefix_sum(counts: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in counts.items() if k.startswith(prefix))


def test_six_archive_yield_in_local_executor(tmp_path):
    six_archives(tmp_path / "src")
    steps = [ArxivSourceReader(str(tmp_path / "src")), LatexToText()]
    docs, counts = run_pipeline(steps, tmp_path)
    texts = {d["id"]: d["text"] for d in docs}
    assert sorted(texts) == ["1001.00001", "1001.00004", "1001.00006"]
    assert texts["1001.00006"] == texts["1001.00001"]  # the exact copy a dedup stage drops
    assert prefix_sum(counts, "invalid/") == 1 and counts["invalid/corrupt"] == 1
    assert prefix_sum(counts, "empty_tex/") == 2
    tar_doc = next(d for d in docs if d["id"] == "1001.00001")
    assert "## S" in tar_doc["text"] and "latex_files" not in tar_doc


def test_metadata_to_text_pipeline_with_broken_archive(tmp_path):
    src = tmp_path / "src"
    six_archives(src)
    snapshot = tmp_path / "meta.jsonl"
    rows = [record(id=f"1001.0000{i}", title=f"Paper {i}", versions=[{"created": "2010"}])
            for i in range(1, 6)]
    rows.append(record(id="1001.00009", categories="astro-ph"))  # dropped before any read
    rows.append(record(id="1001.00007"))  # kept, but no archive on disk
    snapshot.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken json\n")
    steps = [ArxivMetadataFilter(str(snapshot)), ArxivSourceReader(str(src)), LatexToText()]
    docs, counts = run_pipeline(steps, tmp_path)
    assert sorted(d["id"] for d in docs) == ["1001.00001", "1001.00004"]  # broken #2 skipped
    assert counts["metadata/dropped/category"] == 1 and counts["metadata/dropped/bad_json"] == 1
    assert counts["missing_source"] == 1 and counts["invalid/corrupt"] == 1
    paper = next(d for d in docs if d["id"] == "1001.00004")
    assert paper["text"].startswith(f"Title: Paper 4\nAbstract: {WORDS20}\nBody: ## S")
    assert paper["year"] == 2010 and paper["categories"] == ["hep-th"]


def test_fixture_corpus_in_local_executor(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    paper = FIXTURES / "paper"
    files = {p.relative_to(paper).as_posix(): p.read_text() for p in paper.rglob("*") if p.is_file()}
    (src / "2101.00001.tar.gz").write_bytes(tar_gz(files))
    (src / "2101.00002.gz").write_bytes(gzip.compress((FIXTURES / "lecture.tex").read_bytes()))
    docs, counts = run_pipeline([ArxivSourceReader(str(src)), LatexToText()], tmp_path)
    assert counts["converted"] == 2 and counts["includes_resolved"] == 1
    text = next(d["text"] for d in docs if d["id"] == "2101.00001")
    assert text.startswith("Title: Sharp Bounds for Smooth Operators\nAbstract: We prove")
    assert "## Introduction" in text and "$C_0$" in text
