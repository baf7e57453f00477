"""Safetensors files written tensor by tensor and hashed as they are written, readable as
the user's umask allows, like Kiln's other outputs.

safetensors (0.8) writes its file through a private temporary file, mode 0600 whatever the
umask (an export, or a checkpoint, on a shared filesystem was readable by no one else), and
offers no way to see the bytes on their way: a checkpoint's checksum took a second full
read of the file, and `safetensors.torch.save` holds the whole file in memory. The format is
small (an 8-byte little-endian header length, a JSON header, the tensors' raw bytes), so
Kiln streams it itself; `safetensors.torch.load_file` reads it back.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from kiln.hashing import HashingWriter, file_sha256

# the safetensors names of the dtypes this writer streams (others go through save_file)
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


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
                 metadata: dict[str, str] | None = None) -> str:
    """Write `tensors` to `path` in safetensors format with the permissions a plain file
    would get; returns the file's sha256 (hex), taken as it was written."""
    if sys.byteorder == "little" and all(t.dtype in DTYPES for t in tensors.values()):
        digest = _stream(tensors, path, metadata)
    else:  # a dtype (or a byte order) this writer leaves to safetensors: hashed read back
        save_file(tensors, str(path), metadata=metadata)
        digest = file_sha256(path)
    os.chmod(path, 0o666 & ~_umask())
    return digest


def _stream(tensors: dict[str, torch.Tensor], path: Path | str,
            metadata: dict[str, str] | None) -> str:
    """Header, then each tensor's bytes from its own memory (no copy of the whole file);
    widest dtype first, then by name, as safetensors orders them, so each stays aligned."""
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    start = 0
    for name in names:
        t = tensors[name]
        if t.layout != torch.strided:
            raise ValueError(f"{name}: a sparse tensor cannot be saved; make it dense")
        end = start + t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [start, end]}
        start = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned
    with HashingWriter(path) as out:
        out.write(len(text).to_bytes(8, "little"))
        out.write(text)
        for name in names:
            t = tensors[name].detach()
            if t.device.type != "cpu" or not t.is_contiguous():
                t = t.cpu().contiguous()  # one tensor's copy at a time
            if t.numel():
                out.write(t.reshape(-1).view(torch.uint8).numpy().data)
        return out.hexdigest()
