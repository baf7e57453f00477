"""Safetensors files readable as the user's umask allows, like Kiln's other outputs.

safetensors (0.8) writes its file through a private temporary file, mode 0600 whatever the
umask: an export, or a checkpoint, on a shared filesystem was readable by no one else.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def _umask() -> int:
    try:  # Linux: read it without setting it (os.umask sets it, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tensors(tensors: dict[str, torch.Tensor], path: Path | str,
                 metadata: dict[str, str] | None = None) -> None:
    """`safetensors.torch.save_file`, then the permissions a plain file would get."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())
