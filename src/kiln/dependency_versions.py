"""The installed libraries against the versions Kiln declares, checked before a verb runs.

pip holds the declared ranges at install time, but a library installed afterwards (a GPU
build of torch, a conda package, `pip install --no-deps`, a later upgrade of one library)
can leave them; Kiln would then fail deep inside a stage, on an API the other version lacks
(an old torch: FSDP2's `fully_shard`; an old datatrove: its exact-dedup config). The ranges
are read from Kiln's own installed metadata, so pyproject.toml stays their one source.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import NamedTuple

# a declared requirement's name, and what follows it up to its marker
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)([^;]*)")


class Unmet(NamedTuple):
    name: str
    installed: str | None  # None: not installed at all
    wanted: str  # the requirement as declared, e.g. "torch<3,>=2.6"


def unmet_requirements(distribution: str = "kiln") -> list[Unmet]:
    """Each required library that is missing or outside its declared range (optional
    extras such as `test` are not required). Empty when the distribution is not installed:
    a source tree on PYTHONPATH has no declared ranges to hold."""
    try:
        declared = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    try:
        from packaging.requirements import Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:  # the check's own library is one of those missing (--no-deps)
        return _missing_unchecked(declared)
    unmet = []
    for line in declared:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        wanted = f"{req.name}{req.specifier}"
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(Unmet(req.name, None, wanted))
            continue
        except KeyError:  # no Version in its dist-info: Python's metadata is to raise this
            continue
        try:
            held = req.specifier.contains(Version(installed), prereleases=True)
        except (InvalidVersion, TypeError):
            # a version string packaging cannot read, or none (a dist-info left without its
            # Version by a killed install: packaging 22-26.0 raise TypeError on None, 26.4
            # InvalidVersion): nothing to compare against
            continue
        if not held:
            unmet.append(Unmet(req.name, installed, wanted))
    return unmet


def _missing_unchecked(declared: list[str]) -> list[Unmet]:
    """Without `packaging` to read versions and markers: each library not installed at all
    (packaging among them), from the requirements without a marker (a refusal, not a
    traceback where `packaging` is missing)."""
    unmet = []
    for line in declared:
        m = _NAME.match(line)
        if m is None or ";" in line:
            continue
        try:
            metadata.distribution(m.group(1))  # installed is all that is asked here
        except metadata.PackageNotFoundError:
            unmet.append(Unmet(m.group(1), None, (m.group(1) + m.group(2)).strip()))
    return unmet


def refusal(unmet: list[Unmet]) -> str:
    """The message for a refused start: each library, what is installed and what Kiln
    needs, and the pip command that mends it (for torch, the user picks the build)."""
    lines = "\n  ".join(
        f"{u.name} is not installed (Kiln needs {u.wanted})" if u.installed is None
        else f"{u.name} {u.installed} is installed; Kiln needs {u.wanted}" for u in unmet)
    specs = " ".join(f"'{u.wanted}'" for u in unmet)
    torch = any(u.name == "torch" for u in unmet)
    return (f"{'a library does' if len(unmet) == 1 else f'{len(unmet)} libraries do'} not "
            f"match the versions Kiln declares:\n  {lines}\n  install them: pip install "
            f"{specs}" + ("  (for torch, the build for your machine: CPU or CUDA)"
                          if torch else ""))
