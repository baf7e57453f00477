"""The run folder's writability probe, cut short: its folder in the run's parent (a user's
folder) is recognisable and cleared by the next command, and only when it is abandoned."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from kill_points import kiln_killed_at

from kiln.run_dir import check_run_dir_writable, clear_killed_probes

_PROBE = ".kiln-probe-"


def test_a_kill_inside_the_probe_leaves_a_folder_the_next_command_clears(tmp_path):
    """`kiln prepare` killed between making its probe folder and removing it left an empty
    `.kiln-probe-*` in the parent of run.dir, which no later command removed."""
    from conftest import tiny_config

    run = tmp_path / "run"
    kiln_killed_at("os:rmdir", "prepare", "--set", f'run.dir="{run}"', matching="kiln-probe")
    assert [p.name for p in tmp_path.glob(f"{_PROBE}*")]  # what the kill left
    assert not run.exists()

    check_run_dir_writable(tiny_config(run), may_make=True)  # the next command's check
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_abandoned_probe_folders_are_cleared(tmp_path):
    """A probe of a process alive on this host, or one of another host made within the
    hour, may be in use: it stays. A folder that is not empty is no probe's: it stays."""
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
        host = platform.node()
        names = {"dead": f"{_PROBE}{host}-{dead}-abc_12", "alive": f"{_PROBE}{host}-{alive.pid}-x1",
                 "elsewhere": f"{_PROBE}other-host-{dead}-x2", "old_elsewhere": f"{_PROBE}other-{dead}-x3",
                 "unnamed_old": f"{_PROBE}q8z1", "full": f"{_PROBE}{host}-{dead}-x4"}
        for name in names.values():
            (tmp_path / name).mkdir()
        (tmp_path / names["full"] / "kept").write_text("a user's")
        hour_ago = time.time() - 2 * 3600
        for key in ("old_elsewhere", "unnamed_old"):
            os.utime(tmp_path / names[key], (hour_ago, hour_ago))
        clear_killed_probes(tmp_path)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(names[k] for k in ("alive", "elsewhere", "full"))
    finally:
        alive.kill()
        alive.wait()


def test_a_probe_names_its_host_and_process(tmp_path, monkeypatch):
    """What the probe makes says whose it is (the clearing above reads its name)."""
    from conftest import tiny_config

    from kiln import run_dir as run_dir_mod

    made: list[Path] = []
    real = run_dir_mod.os.rmdir
    monkeypatch.setattr(run_dir_mod.os, "rmdir", lambda p: (made.append(Path(p)), real(p)))
    check_run_dir_writable(tiny_config(tmp_path / "a" / "run"), may_make=True)
    (probe,) = made
    assert probe.parent == tmp_path
    assert probe.name.startswith(f"{_PROBE}{platform.node()}-{os.getpid()}-")
