"""`run_prepare(progress=False)` turns off every progress bar on the console, datatrove's own
(exact dedup's, which take no switch) as well as Kiln's reader's."""

import pytest

from kiln.data.pipeline import PrepareConfig, run_prepare


def _source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_text(f"document number {i}\n" * 5)
    (src / "copy.txt").write_text("document number 0\n" * 5)
    return src


@pytest.mark.parametrize("tasks", [1, 2])  # 2: the tasks run in datatrove's worker processes
def test_progress_off_shows_no_bar_of_datatrove_either(tmp_path, capfd, tasks):
    cfg = PrepareConfig(stages=["read", "dedup_exact", "write"], tasks=tasks, workers=tasks)
    summary = run_prepare(cfg, tmp_path / "run", [str(_source(tmp_path))], progress=False)
    assert summary["documents_out"] == 3  # the copy is gone: dedup ran
    err = capfd.readouterr().err
    assert "%|" not in err and "it/s" not in err and "Initializing pq" not in err, err


def test_progress_on_still_shows_the_bars(tmp_path, capfd):
    cfg = PrepareConfig(stages=["read", "dedup_exact", "write"])
    run_prepare(cfg, tmp_path / "run", [str(_source(tmp_path))], progress=True)
    err = capfd.readouterr().err
    # Kiln's reader's bar, and datatrove's own (exact dedup keeps the first copy overall with
    # a merge of its own, not datatrove's "Initializing pq" finder: its other steps' bars)
    assert "read rank 0" in err and "it/s" in err.replace("file/s", ""), err
