"""The README's "Layout" names every module of src/kiln, and benchmarks/README.md every
benchmark script: a module added without its line leaves a new reader with a map that
stops short of the code (six of today's modules and eight older ones were missing)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kiln"
# packages the Layout names as a whole folder (`pii/`), not module by module
FOLDERS = ("data/filters", "data/pii", "data/decontam", "data/arxiv", "report")


def _layout() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Layout", 1)[1].split("```")[1]


def test_layout_names_every_module() -> None:
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _layout()))
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        folder = next((f for f in FOLDERS if rel.startswith(f + "/")), None)
        if folder is not None:
            if folder.rsplit("/", 1)[-1] not in words:
                missing.append(folder + "/")
        elif path.stem != "__init__" and path.stem not in words:
            missing.append(rel)
    assert not missing, f"README.md's Layout does not name: {sorted(set(missing))}"


def test_benchmarks_readme_names_every_script() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    helpers = {"common.py"}  # shared timing helpers, not a benchmark
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py"))
               if p.name not in helpers and p.name not in text]
    assert not missing, f"benchmarks/README.md does not name: {missing}"
