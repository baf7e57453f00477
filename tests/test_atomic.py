"""Atomic folder writes: a writer killed mid-swap loses nothing and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.atomic import atomic_dir, write_text_atomic


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_replaces_the_folder_only_on_success(tmp_path):
    target = tmp_path / "tokens"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("killed halfway")
    assert (target / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_a_killed_writers_half_folder_is_cleared(tmp_path):
    target = tmp_path / "tokens"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    stale = tmp_path / f".tokens.tmp-{dead_pid()}"
    stale.mkdir()
    (stale / "a").write_text("half")
    live = tmp_path / f".tokens.tmp-{os.getppid()}"  # a writer still running: not ours to clear
    live.mkdir()
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("2")
    assert not stale.exists() and live.exists()
    assert (target / "a").read_text() == "2"


def test_a_writer_killed_between_the_two_renames_is_undone(tmp_path):
    """Killed after moving the old folder aside and before moving the new one in: the old
    folder is the last complete version, so it is put back before the next write."""
    target = tmp_path / "tokens"
    aside = tmp_path / f".tokens.old-{dead_pid()}"
    aside.mkdir()
    (aside / "a").write_text("complete")
    half = tmp_path / f".tokens.tmp-{aside.name.rsplit('-', 1)[1]}"
    half.mkdir()
    with pytest.raises(RuntimeError), atomic_dir(target):
        raise RuntimeError("this write fails too")
    assert (target / "a").read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_a_killed_file_writers_temporary_is_cleared(tmp_path):
    stale = tmp_path / f".eval.json.tmp-{dead_pid()}"
    stale.write_text("{half")
    write_text_atomic(tmp_path / "eval.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]


def test_a_predecessor_with_our_own_pid_is_recovered(tmp_path):
    """In a container the restarted writer often has the killed one's pid (pid 1): what
    carries our own pid at the start of a write can only be a dead predecessor's."""
    target = tmp_path / "tokens"
    aside = tmp_path / f".tokens.old-{os.getpid()}"
    aside.mkdir()
    (aside / "a").write_text("complete")
    with atomic_dir(target) as tmp:
        assert (target / "a").read_text() == "complete"  # put back before this write
        (tmp / "a").write_text("new")
    assert (target / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_a_failed_file_write_leaves_the_old_file(tmp_path):
    """An error inside the block (a full disk, a bug half-way through) keeps what was there."""
    from kiln.atomic import atomic_path, write_json_atomic

    path = tmp_path / "index.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(RuntimeError, match="half-way"):
        with atomic_path(path) as tmp:
            tmp.write_text('{"v": 2, "trunc')
            raise RuntimeError("half-way")
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]  # no temporary left


def test_a_failed_folder_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    """The old folder is moved aside before the new one takes its name: if that second
    rename fails, the old one must come back."""
    import kiln.atomic as atomic

    path = tmp_path / "tokens"
    with atomic_dir(path) as tmp:
        (tmp / "a.bin").write_text("old")
    real_replace, calls = os.replace, []

    def second_rename_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", second_rename_fails)
    with pytest.raises(OSError, match="rename failed"):
        with atomic_dir(path) as tmp:
            (tmp / "a.bin").write_text("new")
    monkeypatch.undo()
    assert (path / "a.bin").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_a_linked_folder_or_file_is_replaced_where_it_links_to(tmp_path):
    """`tokens/` linked to a larger disk: a re-tokenize writes its shards there and keeps the
    link, rather than putting them on the run's disk and leaving the old ones behind."""
    (tmp_path / "big").mkdir()
    target, link = tmp_path / "big" / "tokens", tmp_path / "run" / "tokens"
    with atomic_dir(target) as tmp:
        (tmp / "old.bin").write_text("old")
    link.parent.mkdir()
    link.symlink_to(target)
    with atomic_dir(link) as tmp:
        (tmp / "new.bin").write_text("new")
    assert link.is_symlink() and sorted(p.name for p in target.iterdir()) == ["new.bin"]
    assert sorted(p.name for p in link.parent.iterdir()) == ["tokens"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["tokens"]
    (tmp_path / "big" / "t.json").write_text("1")
    (link.parent / "t.json").symlink_to(tmp_path / "big" / "t.json")
    write_text_atomic(link.parent / "t.json", "2")
    assert (link.parent / "t.json").is_symlink() and (tmp_path / "big" / "t.json").read_text() == "2"


def test_the_new_folder_is_synced_before_the_old_one_moves_aside(tmp_path, monkeypatch):
    """A `.tmp-PID` beside the `.old-PID` of a killed writer is taken for complete (an
    export is finished, not discarded): its folders' entries must be on disk by then, not
    only its files' bytes."""
    import kiln.atomic as atomic

    path = tmp_path / "export"
    with atomic_dir(path) as tmp:
        (tmp / "a").write_text("old")
    events: list[str] = []
    real_replace, real_sync = os.replace, atomic.fsync_dir
    monkeypatch.setattr(atomic, "fsync_dir", lambda d: events.append(f"sync {d.name}")
                        or real_sync(d))
    monkeypatch.setattr(atomic.os, "replace", lambda s, d: events.append(f"move {s.name}")
                        or real_replace(s, d))
    with atomic_dir(path) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub/b").write_text("new")
    pid = os.getpid()
    moved_aside = events.index("move export")
    assert {f"sync .export.tmp-{pid}", "sync sub"} <= set(events[:moved_aside])
    assert (path / "sub/b").read_text() == "new"


def test_a_file_or_folder_in_the_way_is_refused_by_name_and_kept(tmp_path):
    """A user's file where Kiln keeps a folder (`RUN/plots`), or a folder where it writes a
    file: one RunDataError naming it, the user's file untouched (was a bare FileExistsError
    or IsADirectoryError traceback, and a file replaced by a folder silently)."""
    from kiln.errors import RunDataError

    (tmp_path / "plots").write_text("mine")
    with pytest.raises(RunDataError, match=r"plots is a file where Kiln keeps a folder"):
        write_text_atomic(tmp_path / "plots" / "loss.png", "png")
    with pytest.raises(RunDataError, match=r"plots is a file where Kiln keeps a folder"):
        write_text_atomic(tmp_path / "plots" / "deeper" / "loss.png", "png")
    (tmp_path / "report.html").mkdir()
    with pytest.raises(RunDataError, match=r"a folder of that name is in the way"):
        write_text_atomic(tmp_path / "report.html", "<html>")
    with pytest.raises(RunDataError, match=r"a file of that name is in the way"), \
            atomic_dir(tmp_path / "plots"):
        pass
    assert (tmp_path / "plots").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "report.html"]


def test_a_link_to_a_missing_folder_in_the_way_is_named_as_one(tmp_path):
    """RUN/plots linked to a disk not mounted: it was called 'a file where Kiln keeps a
    folder' (the user looks for a file and finds a link)."""
    from kiln.errors import RunDataError

    (tmp_path / "plots").symlink_to(tmp_path / "gone" / "plots")
    with pytest.raises(RunDataError, match=r"plots is a link to .*gone/plots, which is missing"):
        write_text_atomic(tmp_path / "plots" / "loss.png", "png")
    assert (tmp_path / "plots").is_symlink()
    (tmp_path / "notes").write_text("mine")
    (tmp_path / "plots").unlink()
    (tmp_path / "plots").symlink_to(tmp_path / "notes")
    with pytest.raises(RunDataError, match=r"plots is a link to .*notes, a file, where Kiln"):
        write_text_atomic(tmp_path / "plots" / "loss.png", "png")
