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

from kiln.config import ConfigError
from kiln.data.arxiv import (
    ArchiveLimits,
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
        ({"categories": "physics.optics"}, "category"),  # the source's substring test kept it
        ({"categories": "stat.ML"}, None),
        ({"categories": "stat.AP"}, "category"),
        ({"abstract": " ".join(WORDS20.split()[:19])}, "abstract_short"),
        ({"versions": [{"created": "Fri, 30 Dec 1994 10:00:00 GMT"}]}, "year"),
        ({"versions": [{"created": "Mon, 2 Jan 1995 10:00:00 GMT"}]}, None),
        ({"comments": "This paper has been Withdrawn by the author"}, "withdrawn"),
        ({"id": None}, "bad_record"),
        ({"categories": 5}, "bad_categories"),
        ({"categories": ["hep-th", 5]}, "bad_categories"),
        ({"categories": ["hep-th"]}, None),
        ({"versions": {"v1": {"created": "2021"}}}, "bad_versions"),
        ({"abstract": ["not", "text"]}, "bad_abstract"),
        # no versions: the id's yymm is the first version's month; update_date is the last
        # change's (a 1993 paper revised in 2009 is not from 2009)
        ({"id": "hep-th/9301001", "versions": [], "update_date": "2009-05-01"}, "year"),
        ({"id": "x", "versions": [], "update_date": "2009-05-01"}, None),  # no id date: last
        ({"id": "hep-th/9701001", "versions": [], "update_date": "1998-05-01"}, None),
        ({"id": "x", "versions": [], "created": "1994-01-01", "update_date": "2009-05-01"}, "year"),
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


def counts_of(step) -> dict[str, int]:
    return {key: int(value.total) for key, value in step.stats.stats.items()}


def test_malformed_metadata_records_counted_not_fatal(tmp_path):
    snapshot = tmp_path / "meta.jsonl"
    rows = [record(categories=5), record(versions={"v1": {}}), record(id="2101.00002")]
    lines = [json.dumps(r) for r in rows] + ['{"id": "2101.00003", "n": ' + "9" * 5000 + "}"]
    snapshot.write_text("\n".join(lines) + "\n")
    step = ArxivMetadataFilter(str(snapshot))
    assert [d.id for d in step.run()] == ["2101.00002"]
    counts = counts_of(step)
    assert counts["metadata/dropped/bad_categories"] == 1
    assert counts["metadata/dropped/bad_versions"] == 1
    assert counts["metadata/dropped/bad_json"] == 1


def test_truncated_metadata_snapshot_fails_naming_the_file(tmp_path):
    snapshot = tmp_path / "meta.jsonl.gz"
    rows = [json.dumps(record(id=f"2101.{i:05d}", abstract=f"{WORDS20} {i}")) for i in range(2000)]
    data = gzip.compress("\n".join(rows).encode())
    snapshot.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=rf"prepare.arxiv.snapshot: {snapshot}.*cut off"):
        list(ArxivMetadataFilter(str(snapshot)).run())


def test_folder_mode_restores_old_style_ids(tmp_path):
    (tmp_path / "9901").mkdir()
    (tmp_path / "9901" / "hep-th9901001.gz").write_bytes(gzip.compress((PAPER % 1).encode()))
    (tmp_path / "math-ph0101001.tar.gz").write_bytes(tar_gz({"m.tex": PAPER % 2}))
    (tmp_path / "2101.00001.gz").write_bytes(gzip.compress((PAPER % 3).encode()))
    docs = list(ArxivSourceReader(str(tmp_path)).run())
    assert sorted(d.id for d in docs) == ["2101.00001", "hep-th/9901001", "math-ph/0101001"]
    assert all(d.metadata["arxiv_id"] == d.id for d in docs)
    assert archive_stem("math-ph/0101001")[1] == "math-ph0101001"  # the inverse mapping



def test_old_style_archive_name_from_the_parent_folder(tmp_path):
    # <folder>/hep-th/9901002.gz (as in arxiv.org/e-print/hep-th/9901002): the number alone is no id; the
    # folder, when it is one of arXiv's old archive names, gives it back its archive.
    for rel, data in {"hep-th/9901002.gz": gzip.compress((PAPER % 1).encode()),
                      "math/0501003v2.tar.gz": tar_gz({"m.tex": PAPER % 2}),
                      "9901/hep-th9901001.gz": gzip.compress((PAPER % 3).encode()),
                      "papers/9901004.gz": gzip.compress((PAPER % 4).encode())}.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    docs = list(ArxivSourceReader(str(tmp_path)).run())
    assert sorted(d.id for d in docs) == ["9901004", "hep-th/9901001", "hep-th/9901002", "math/0501003v2"]
    # Lookups by id find that layout too (a subject class maps to its archive's folder), after
    # the <yymm>/<stem> and flat layouts.
    assert find_source_archive(tmp_path, "hep-th/9901002") == tmp_path / "hep-th/9901002.gz"
    assert find_source_archive(tmp_path, "hep-th/9901001v3") == tmp_path / "9901/hep-th9901001.gz"
    (tmp_path / "math/0501003.gz").write_bytes(b"x")
    assert find_source_archive(tmp_path, "math.CO/0501003") == tmp_path / "math/0501003.gz"
    (tmp_path / "0501").mkdir()
    (tmp_path / "0501/math0501003.gz").write_bytes(b"x")
    assert find_source_archive(tmp_path, "math/0501003") == tmp_path / "0501/math0501003.gz"
    assert find_source_archive(tmp_path, "hep-ph/9901002") is None

def test_oversized_file_refused_before_it_is_read(tmp_path, monkeypatch):
    big = tmp_path / "2101.00001.gz"
    big.write_bytes(gzip.compress((PAPER % 1).encode()) + b"\0" * 10_000)
    read = []
    real_open = Path.open

    class SpyFile:
        def __init__(self, f):
            self.f = f

        def read(self, *args):
            read.append(len(out := self.f.read(*args)))
            return out

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(Path, "open", lambda self, *a, **k: SpyFile(real_open(self, *a, **k)))
    step = ArxivSourceReader(str(tmp_path), ArchiveLimits(max_total_bytes=1000))
    assert list(step.run()) == []
    assert counts_of(step)["invalid/too_large"] == 1
    assert sum(read) <= 1001  # never the whole 10 kB file


def test_empty_and_memberless_archives_counted_as_empty(tmp_path):
    (tmp_path / "2101.00001.tar").write_bytes(tarfile_bytes({}))
    (tmp_path / "2101.00002.tar.gz").write_bytes(tar_gz({}))
    (tmp_path / "2101.00003.tar.gz").write_bytes(tar_gz({"README": "x"}))
    step = ArxivSourceReader(str(tmp_path))
    assert list(step.run()) == []
    counts = counts_of(step)
    assert counts["empty_tex/empty_archive"] == 2 and counts["empty_tex/no_tex_file"] == 1
    assert not any(k.startswith("invalid/") for k in counts)


def tar_gz(files: dict[str, str]) -> bytes:
    return tarfile_bytes(files, "w:gz")


def tarfile_bytes(files: dict[str, str], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
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
