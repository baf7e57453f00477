"""Libraries outside Kiln's declared ranges are refused before a verb runs, in one message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.dependency_versions import Unmet, refusal, unmet_requirements

REPO = Path(__file__).resolve().parents[1]


def _dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal installed distribution: what importlib.metadata reads."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_each_library_outside_its_range_is_named(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    _dist(site, "fakekiln", "0.1.0", (
        "fakeold>=2.6,<3", "fakenew>=1,<2", "fakelocal>=2.6,<3", "fakepre>=2.6",
        "fakegone>=0.9", "fakefine>=1.0", 'faketest>=9; extra == "test"',
        'fakeplatform>=9; sys_platform == "nonexistent"'))
    _dist(site, "fakeold", "2.5.1")
    _dist(site, "fakenew", "2.0.0")
    _dist(site, "fakelocal", "2.13.0+cpu")  # a local build label is no reason to refuse
    _dist(site, "fakepre", "2.15.0.dev20261201")  # a nightly past the bound holds it
    _dist(site, "fakefine", "1.0")
    _dist(site, "faketest", "1.0")  # below, but only an extra asks for it
    monkeypatch.syspath_prepend(str(site))

    assert unmet_requirements("fakekiln") == [
        Unmet("fakeold", "2.5.1", "fakeold<3,>=2.6"),
        Unmet("fakenew", "2.0.0", "fakenew<2,>=1"),
        Unmet("fakegone", None, "fakegone>=0.9"),
    ]


def test_a_library_without_a_version_is_passed_over(tmp_path: Path) -> None:
    """A dist-info left without its Version line (a killed install) has nothing to compare:
    packaging 22-26.0 (Kiln allows >= 22) raised a TypeError traceback on it, 26.4
    InvalidVersion. It fails on the old code in `scripts/oldest_deps.sh`'s venv (packaging 22),
    or with `KILN_TEST_PACKAGING` naming a folder holding packaging 22 (`pip --target`)."""
    site = tmp_path / "site"
    _dist(site, "fakekiln", "0.1.0", ("fakeblank>=1", "fakegone>=1"))
    info = site / "fakeblank-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeblank\n")
    path = [str(site), *filter(None, [os.environ.get("KILN_TEST_PACKAGING")]), str(REPO / "src")]
    code = ("from kiln.dependency_versions import unmet_requirements as u; "
            "print([tuple(x) for x in u('fakekiln')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('fakegone', None, 'fakegone>=1')]"


def test_a_version_python_cannot_read_is_passed_over(tmp_path: Path, monkeypatch) -> None:
    """Python's metadata warns that a dist-info without Version will raise KeyError (it
    gives None now): the check passes such a library over instead of a traceback."""
    from importlib import metadata

    site = tmp_path / "site"
    _dist(site, "fakekiln", "0.1.0", ("fakeblank>=1", "fakegone>=1"))
    _dist(site, "fakeblank", "1.0")
    monkeypatch.syspath_prepend(str(site))
    version = metadata.version

    def keyerror_for_blank(name: str) -> str:
        if name == "fakeblank":
            raise KeyError("Version")
        return version(name)

    monkeypatch.setattr(metadata, "version", keyerror_for_blank)
    assert unmet_requirements("fakekiln") == [Unmet("fakegone", None, "fakegone>=1")]


def test_without_packaging_the_missing_libraries_are_named(tmp_path: Path) -> None:
    """`packaging`, the check's own library, is a declared one too: installed with
    `--no-deps` into an environment without it, the check ended in an ImportError
    traceback. Now the libraries not installed at all are named (versions, and markers,
    need packaging to be read: those are left to the run once it is installed)."""
    site = tmp_path / "site"
    _dist(site, "fakekiln", "0.1.0", (
        "fakegone>=0.9", "fake-old>=2", "fakepackaging>=22", "fakeextra[x]>=1",
        'fakemarked>=1; sys_platform == "nonexistent"', 'faketest>=9; extra == "test"'))
    _dist(site, "fake_old", "1.0")  # below, but no version can be read without packaging
    (site / "packaging").mkdir()  # packaging cannot be imported
    (site / "packaging" / "__init__.py").write_text("raise ImportError('no packaging')\n")
    code = ("from kiln.dependency_versions import unmet_requirements as u; "
            "print([tuple(x) for x in u('fakekiln')])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([("fakegone", None, "fakegone>=0.9"),
                                      ("fakepackaging", None, "fakepackaging>=22"),
                                      ("fakeextra", None, "fakeextra[x]>=1")])


def test_a_source_tree_that_is_not_installed_checks_nothing() -> None:
    assert unmet_requirements("no-such-distribution-kiln-test") == []


def test_the_refusal_names_versions_and_the_mending_command() -> None:
    text = refusal([Unmet("torch", "2.5.1", "torch<3,>=2.6"),
                    Unmet("datatrove", None, "datatrove>=0.9")])
    assert "2 libraries do not match the versions Kiln declares" in text
    assert "torch 2.5.1 is installed; Kiln needs torch<3,>=2.6" in text
    assert "datatrove is not installed (Kiln needs datatrove>=0.9)" in text
    assert "pip install 'torch<3,>=2.6' 'datatrove>=0.9'" in text
    assert "CPU or CUDA" in text  # torch's build is the user's choice
    one = refusal([Unmet("datatrove", "0.8.0", "datatrove>=0.9")])
    assert one.startswith("a library does not match") and "CPU or CUDA" not in one


def _commands() -> list:
    commands = [pytest.param([sys.executable, "-m", "kiln"], id="python -m kiln")]
    script = shutil.which("kiln", path=str(Path(sys.executable).parent))
    if script:  # the console script pip wrote for the installed package
        commands.append(pytest.param([script], id="console script"))
    return commands


@pytest.mark.parametrize("command", _commands())
def test_an_older_torch_is_refused_before_kiln_imports_it(tmp_path: Path, command) -> None:
    """A torch below the declared range (here its metadata, found first on the path) stops
    the command with exit 2 and one message, before any verb's module is imported."""
    from importlib import metadata

    try:
        metadata.requires("kiln")
    except metadata.PackageNotFoundError:
        pytest.skip("Kiln is not installed here (run from a source tree): no declared ranges")
    site = tmp_path / "site"
    _dist(site, "torch", "2.0.0")
    (site / "torch").mkdir()  # and a torch that cannot be imported: the check comes first
    (site / "torch" / "__init__.py").write_text("raise ImportError('imported too soon')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([*command, "--version"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("kiln: a library does not match the versions Kiln declares")
    assert "torch 2.0.0 is installed; Kiln needs torch" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
