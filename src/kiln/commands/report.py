"""`kiln report`: the run directory as report.html, other runs' curves overlaid on request."""

from __future__ import annotations

from pathlib import Path

from kiln.config import Config


def cmd_report(cfg: Config, compare: list[str] | tuple[str, ...] = ()) -> None:
    from kiln.report import build_report

    print(f"report: {build_report(cfg.run_dir, compare=[Path(c) for c in compare])}")
