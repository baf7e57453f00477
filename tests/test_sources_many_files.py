"""Many small files: after prepare has read a 100,000-file source, saying whether a source is
empty must not walk it again with a realpath per file (18 s of a 57 s read+write run)."""

import os

from kiln.data.sources import sources_without_files


def test_a_source_is_known_not_empty_at_its_first_file(tmp_path, monkeypatch):
    src = tmp_path / "corpus"
    for d in range(5):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(200):
            (src / f"d{d}" / f"{i}.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "node_modules").mkdir()
    (tmp_path / "empty" / "node_modules" / "a.txt").write_text("not searched")
    calls = []
    real = os.path.realpath

    def counted(path, *args, **kwargs):
        calls.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counted)
    assert sources_without_files([str(src), str(tmp_path / "empty"),
                                  str(tmp_path / "gone")]) == [
        str(tmp_path / "empty"), str(tmp_path / "gone")]
    assert len(calls) < 50  # the folders and one file, not the 1,000 files


def test_a_source_whose_files_all_lie_in_the_excluded_run_dir_is_empty(tmp_path):
    src = tmp_path / "corpus"
    (src / "run" / "documents").mkdir(parents=True)
    (src / "run" / "documents" / "00000.jsonl").write_text("{}")
    assert sources_without_files([str(src)], exclude=src / "run") == [str(src)]
    (src / "a.txt").write_text("text")
    assert sources_without_files([str(src)], exclude=src / "run") == []
