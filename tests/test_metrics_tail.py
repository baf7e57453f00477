"""A resume sets aside the records past its checkpoint: exactly those lines move, byte for
byte, and a metrics.jsonl of a long run is streamed, never held in memory."""

from __future__ import annotations

import json
import tracemalloc

from kiln.train import run_records  # where the trainer calls it at a resume


def _line(step: int, kind: str = "train") -> bytes:
    return (json.dumps({"kind": kind, "step": step, "loss": 2.0 + 1 / step, "lr": 3e-4,
                        "grad_norm": 1.0, "tokens": step * 4096, "tokens_per_s": 5e4,
                        "elapsed_s": step * 0.1}) + "\n").encode()


def test_only_the_records_past_the_step_move_and_every_other_line_stays_as_it_is(tmp_path):
    torn, foreign = b'{"kind": "train", "step": 1', b"\xff not json \r\xc2\x85 kept\n"
    head = b"".join(_line(s) for s in range(1, 5)) + torn + b"\n" + _line(4, "val")
    tail = [_line(5), foreign, _line(6), b'{"step": true}\n', _line(3, "val")]
    (tmp_path / "metrics.jsonl").write_bytes(head + b"".join(tail) + b'{"kind": "tr')
    dest = run_records.set_aside_records_after(tmp_path, 4)
    assert (dest / "metrics.jsonl").read_bytes() == _line(5) + _line(6)
    assert (tmp_path / "metrics.jsonl").read_bytes() == (
        head + foreign + b'{"step": true}\n' + _line(3, "val") + b'{"kind": "tr\n')


def test_nothing_past_the_step_leaves_the_file_and_the_archive_alone(tmp_path):
    body = b"".join(_line(s) for s in range(1, 50)) + b'{"kind": "train", "st'
    (tmp_path / "metrics.jsonl").write_bytes(body)
    assert run_records.set_aside_records_after(tmp_path, 49) is None
    assert (tmp_path / "metrics.jsonl").read_bytes() == body
    assert not (tmp_path / "archive").exists()
    assert run_records.set_aside_records_after(tmp_path / "nowhere", 3) is None


def test_a_long_runs_metrics_are_streamed_not_held_in_memory(tmp_path):
    """A million-step run's metrics.jsonl is hundreds of megabytes (gigabytes with MoE
    loads): a resume that read it whole could run out of memory before training."""
    n = 40_000
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        for step in range(1, n + 1):
            f.write(_line(step))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        dest = run_records.set_aside_records_after(tmp_path, n - 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len((dest / "metrics.jsonl").read_bytes().splitlines()) == 100
    assert path.stat().st_size == size - sum(len(_line(s)) for s in range(n - 99, n + 1))
    assert peak < size / 8, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"


def test_a_set_aside_killed_before_metrics_lost_its_lines_is_not_archived_twice(
        tmp_path, monkeypatch):
    """Killed after the archive's copy was in place, before metrics.jsonl lost the lines,
    a set-aside left them in both; the re-run's resume set them aside again, into a second
    folder: the same lines archived twice."""
    import os

    from kiln import atomic

    head, later = b"".join(_line(s) for s in range(1, 5)), _line(5) + _line(6)
    (tmp_path / "metrics.jsonl").write_bytes(head + later)
    real = os.replace

    def killed_at_metrics(src, dst):
        if str(dst) == str(tmp_path / "metrics.jsonl"):
            raise KeyboardInterrupt  # as a kill there: the archive's copy already placed
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", killed_at_metrics)
    try:
        run_records.set_aside_records_after(tmp_path, 4)
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_bytes() == head + later  # nothing lost

    dest = run_records.set_aside_records_after(tmp_path, 4)
    assert [p.name for p in (tmp_path / "archive").iterdir()] == [dest.name]
    assert (dest / "metrics.jsonl").read_bytes() == later
    assert (tmp_path / "metrics.jsonl").read_bytes() == head


def test_an_empty_archive_folder_a_killed_set_aside_left_goes(tmp_path):
    """Killed just after it made its archive folder, a set-aside left it empty beside the
    one the re-run made."""
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(_line(s) for s in range(1, 7)))
    (tmp_path / "archive" / "after-step-4-20200101-000000").mkdir(parents=True)
    dest = run_records.set_aside_records_after(tmp_path, 4)
    assert [p.name for p in (tmp_path / "archive").iterdir()] == [dest.name]


def test_a_set_aside_killed_while_it_wrote_the_archive_copy_leaves_no_second_folder(tmp_path):
    """Killed while it wrote its archive copy (the temporary file whole, not yet renamed),
    a set-aside left that file in its folder: the re-run made a second folder, and the
    first kept the same lines under a hidden temporary name."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    head, later = b"".join(_line(s) for s in range(1, 5)), _line(5) + _line(6)
    (tmp_path / "metrics.jsonl").write_bytes(head + later)
    killed = tmp_path / "archive" / "after-step-4-20200101-000000"
    killed.mkdir(parents=True)
    (killed / f".metrics.jsonl.tmp-{dead}").write_bytes(later)
    dest = run_records.set_aside_records_after(tmp_path, 4)
    assert [p.name for p in (tmp_path / "archive").iterdir()] == [dest.name]
    assert sorted(p.name for p in dest.iterdir()) == ["metrics.jsonl"]
    assert (dest / "metrics.jsonl").read_bytes() == later
