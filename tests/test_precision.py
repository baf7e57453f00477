"""Precision choice from the CPU's flags: bf16 only where it runs natively."""

from __future__ import annotations

import warnings

import pytest
import torch

from kiln.train import precision

CPU = torch.device("cpu")


@pytest.mark.parametrize("flags,expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, "bf16"),
    ({"avx2", "amx_tile", "amx_bf16"}, "bf16"),
    ({"avx2", "avx512f"}, "fp32"),  # AVX-512 without its BF16 extension
    (set(), "fp32"),  # flags unreadable
])
def test_auto_picks_bf16_only_with_native_bf16(monkeypatch, flags, expected):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("auto", CPU) == expected


def test_explicit_bf16_without_native_support_is_kept_with_a_warning(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(precision, "_WARNED", [])
    with pytest.warns(UserWarning, match="emulated"):
        assert precision.resolve_precision("bf16", CPU) == "bf16"
    with warnings.catch_warnings():  # once a process (`kiln run` trains, then evaluates)
        warnings.simplefilter("error")
        assert precision.resolve_precision("bf16", CPU) == "bf16"
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("bf16", CPU) == "bf16"
        assert precision.resolve_precision("fp32", CPU) == "fp32"


def test_the_emulated_bf16_warning_is_said_once_per_node_not_by_every_rank(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(precision, "_WARNED", [])
    monkeypatch.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("bf16", CPU) == "bf16"
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.warns(UserWarning, match="emulated"):
        precision.resolve_precision("bf16", CPU)


def test_bf16_autocast_runs_matmuls_in_bf16_and_fp32_leaves_them():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with precision.autocast(CPU, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with precision.autocast(CPU, "fp32"):
        assert (a @ b).dtype == torch.float32


def test_the_cli_prints_kiln_warnings_as_one_line_and_leaves_others_alone(tiny_run, monkeypatch,
                                                                          capsys):
    """`kiln train` with bf16 forced on a CPU without it: one `warning:` line naming the
    setting, not Python's `file:line: UserWarning` with a source line; a warning from
    outside Kiln keeps Python's format; after the command the handler is Python's again."""
    from kiln import cli

    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(precision, "_WARNED", [])
    before = warnings.showwarning
    assert cli.main(["train", str(tiny_run), "--set", "train.precision=bf16",
                     "--set", "train.steps=1"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "emulated" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: train.precision = 'bf16' on a CPU")
    assert "UserWarning" not in err and "resolve_precision(" not in err
    assert warnings.showwarning is before

    def other_library(argv):  # a warning raised outside the kiln package
        warnings.warn_explicit("from elsewhere", UserWarning, "/elsewhere/lib.py", 7)
        return 0

    monkeypatch.setattr(cli, "_main", other_library)
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a: shown.append(a[:4]))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main([]) == 0
    assert [(str(m), c, f, n) for m, c, f, n in shown] == [
        ("from elsewhere", UserWarning, "/elsewhere/lib.py", 7)]
    assert capsys.readouterr().err == ""


def _gpu(monkeypatch, ampere: bool) -> None:
    """A visible GPU; before Ampere bf16 is only emulated (torch's plain
    `is_bf16_supported()` still says yes there: it can make bf16 tensors)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: ampere or including_emulation)
    monkeypatch.setattr(precision, "_WARNED", [])


@pytest.mark.parametrize("ampere,expected", [(True, "bf16"), (False, "fp32")])
def test_auto_on_a_gpu_picks_bf16_only_with_bf16_tensor_cores(monkeypatch, ampere, expected):
    """A V100 or T4 emulates bf16 matmuls, no faster than fp32: 'auto' must not pick it there
    (it did, through torch's is_bf16_supported(), which counts emulation as support)."""
    _gpu(monkeypatch, ampere)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("auto", torch.device("cuda")) == expected


def test_explicit_bf16_on_a_gpu_without_bf16_tensor_cores_is_kept_with_a_warning(monkeypatch):
    _gpu(monkeypatch, ampere=False)
    with pytest.warns(UserWarning, match="older than Ampere"):
        assert precision.resolve_precision("bf16", torch.device("cuda")) == "bf16"
    _gpu(monkeypatch, ampere=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("bf16", torch.device("cuda")) == "bf16"


class _CpuInfo:
    """/proc/cpuinfo as `text`, or unreadable (None)."""

    def __init__(self, text: str | None):
        self.text = text

    def __call__(self, path):
        assert str(path) == "/proc/cpuinfo"
        return self

    def read_text(self) -> str:
        if self.text is None:
            raise PermissionError("/proc/cpuinfo")
        return self.text


ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd bf16 i8mm sve\n"


@pytest.mark.parametrize("cpuinfo", [None, ARM_CPUINFO])
@pytest.mark.parametrize(("cpuid", "expected"), [(True, "bf16"), (False, "fp32")])
def test_unknown_flags_ask_the_cpuid_probe(monkeypatch, cpuinfo, cpuid, expected):
    """An unreadable /proc/cpuinfo (a sandbox) or one without x86 flags: the choice was
    fp32 whatever the CPU; torch's CPUID probe now decides (False off x86), silently."""
    monkeypatch.setattr(precision, "Path", _CpuInfo(cpuinfo))
    monkeypatch.setattr(precision, "_WARNED", [])
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: cpuid)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert precision.cpu_flags() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve_precision("auto", CPU) == expected
    assert precision.has_fast_bf16(CPU) is cpuid
    with warnings.catch_warnings(record=True) as said:  # 'emulated' where CPUID says so
        warnings.simplefilter("always")
        assert precision.resolve_precision("bf16", CPU) == "bf16"
    assert ["emulated" in str(w.message) for w in said] == ([] if cpuid else [True])


def test_unknown_flags_without_a_probe_choose_fp32_and_say_so(monkeypatch):
    monkeypatch.setattr(precision, "Path", _CpuInfo(None))
    monkeypatch.setattr(precision, "_WARNED", [])
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    with pytest.warns(UserWarning, match=r"'auto' chose fp32: this CPU's features could not"):
        assert precision.resolve_precision("auto", CPU) == "fp32"
    with warnings.catch_warnings():  # once a process
        warnings.simplefilter("error")
        assert precision.resolve_precision("auto", CPU) == "fp32"
        # the kernel's flags, where it gives them, decide without a word
        monkeypatch.setattr(precision, "Path", _CpuInfo("flags\t: fpu avx2 avx512f\n"))
        monkeypatch.setattr(precision, "_WARNED", [])
        assert precision.resolve_precision("auto", CPU) == "fp32"
