"""Choose the compute device and precision: bf16 only where the hardware runs it fast."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

from kiln.config import ConfigError
from kiln.parallel.distributed import first_on_its_node

# CPU flags that mean bf16 matmuls run natively (AVX-512 BF16 dot products, AMX tiles)
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_WARNED: list[bool] = []  # the emulated-bf16 warning, once a process


def cpu_flags() -> set[str] | None:
    """The kernel's CPU flags; None where /proc/cpuinfo is unreadable or has no flags line
    (not Linux, a sandbox hiding it, an Arm CPU, whose line is "Features")."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def cpuid_has_fast_bf16() -> bool | None:
    """AVX-512 BF16 or AMX as torch's own CPUID probe sees them (False off x86); None where
    this torch has no probe. Asked only when the kernel's flags are unknown."""
    probes = [getattr(torch.cpu, name, None)
              for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not all(callable(probe) for probe in probes):
        return None
    try:
        return any(probe() for probe in probes)
    except RuntimeError:
        return None


def cpu_has_fast_bf16() -> bool | None:
    """None: neither the kernel's flags nor a CPUID probe could tell."""
    flags = cpu_flags()
    if flags is None:
        return cpuid_has_fast_bf16()
    return any(flag in flags for flag in _BF16_CPU_FLAGS)


def cuda_has_fast_bf16() -> bool:
    """bf16 tensor-core matmuls: compute capability 8.0 (Ampere) and later, or ROCm. Not
    `torch.cuda.is_bf16_supported()` as called plainly: it also says yes where bf16 is only
    emulated (a V100 or T4 makes bf16 tensors, but multiplies them without tensor cores:
    no faster than fp32, and less precise)."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def has_fast_bf16(device: torch.device) -> bool:
    """bf16 matmuls run natively on `device`: a GPU with bf16 tensor cores, a CPU with
    AVX-512 BF16 or AMX (elsewhere they are emulated)."""
    return cuda_has_fast_bf16() if device.type == "cuda" else bool(cpu_has_fast_bf16())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> str:
    """'auto' picks bf16 on GPUs with bf16 tensor cores and on CPUs with native bf16, else
    fp32. An explicit 'bf16' on hardware without native bf16 is kept, with a warning: torch
    then emulates bf16 matmuls (the quickstart trained at 63 tokens/s against fp32's ~4,300 on
    an AVX2 EPYC)."""
    if name == "bf16" and not _WARNED and first_on_its_node():  # a node's ranks share it
        if device.type == "cpu" and cpu_has_fast_bf16() is False:
            _WARNED.append(True)  # once a process: `kiln run` resolves it for training and eval
            warnings.warn("train.precision = 'bf16' on a CPU without AVX-512 BF16 or AMX: bf16 "
                          "matmuls are emulated here, tens of times slower than fp32 (the "
                          "quickstart: 63 against ~4,300 tokens/s); use 'auto' or 'fp32'",
                          stacklevel=2)
        elif device.type == "cuda" and not cuda_has_fast_bf16():
            _WARNED.append(True)
            warnings.warn("train.precision = 'bf16' on a GPU older than Ampere (compute "
                          "capability < 8.0): it has no bf16 tensor cores, so bf16 matmuls are "
                          "emulated, no faster than fp32 and less precise; use 'auto' or 'fp32'",
                          stacklevel=2)
    if name != "auto":
        return name
    if device.type == "cpu" and cpu_has_fast_bf16() is None and not _WARNED \
            and first_on_its_node():
        _WARNED.append(True)
        warnings.warn("train.precision = 'auto' chose fp32: this CPU's features could not be "
                      "read (/proc/cpuinfo, CPUID); set train.precision = 'bf16' if it has "
                      "AVX-512 BF16 or AMX, or 'fp32' to silence this", stacklevel=2)
    return "bf16" if has_fast_bf16(device) else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision context: weights and optimizer stay fp32, matmuls run in bf16."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
