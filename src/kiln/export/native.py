"""Kiln's own export format, for models no Hugging Face architecture represents exactly.

A folder with `model.safetensors` (the model's state dict under Kiln's names, MoE balancer
buffers included), `config.toml` (the resolved Kiln run config, whose [model] table rebuilds
the architecture), `tokenizer.json`, and `kiln_export.json` (format tag and the reason this
format was chosen). `load_native` turns it back into a `Transformer`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

from kiln.atomic import atomic_dir
from kiln.config import Config, ConfigError, config_to_toml, load_config, validate
from kiln.export.hf_folder import is_tied
from kiln.export_recovery import EXPORT_RECORD, describe_stranded, is_run_export, recover_export
from kiln.model.transformer import Transformer
from kiln.parallel.meta_init import assign_weights, build_on_meta
from kiln.tensor_files import save_tensors

NATIVE_FORMAT = "kiln-native"
FILES = ("model.safetensors", "config.toml", "tokenizer.json", EXPORT_RECORD)


def native_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The state dict on the CPU, not copied there (a copy held a second model in memory
    while the file was written: a model that loads would not export); a tied head is left
    out (safetensors stores no aliases)."""
    return {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()
            if not (name == "head.weight" and is_tied(model))}


def export_native(
    model: Transformer, tokenizer_path: Path, out_dir: Path, config: Config, reason: str,
    checkpoint: str | None = None,
) -> Path:
    """Write the native folder to `out_dir` atomically; `config` is the run's config (its
    model section is replaced by the model's own, vocabulary resolved)."""
    tokenizer_path, out_dir = Path(tokenizer_path), Path(out_dir)
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {tokenizer_path}")
    resolved = validate(dataclasses.replace(config, model=model.cfg))  # loadable back, or raise
    meta = {"format": NATIVE_FORMAT, "reason": reason, "tied_embeddings": is_tied(model),
            "load_with": "kiln.export.native.load_native(path)", "checkpoint": checkpoint}
    with atomic_dir(out_dir) as tmp:
        save_tensors(native_state_dict(model), tmp / "model.safetensors",
                     metadata={"format": NATIVE_FORMAT})
        (tmp / "config.toml").write_text(config_to_toml(resolved))
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        (tmp / EXPORT_RECORD).write_text(json.dumps(meta, indent=2) + "\n")
    return out_dir


def load_native(path: Path | str) -> Transformer:
    """Rebuild the exported model (eval mode, CPU, fp32 as saved). Every tensor of the
    architecture must be in the file and nothing else (strict), so a folder from another
    Kiln version fails loudly instead of loading half its weights. A killed export's swap is
    finished only in a run's export/ (as `kiln report` would); elsewhere loading moves
    nothing and only says what it found beside `path`."""
    path = Path(path)
    note = recover_export(path, path.parent) if is_run_export(path) else describe_stranded(path)
    if note:
        warnings.warn(note, stacklevel=2)
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{path} is not a Kiln native export (missing {', '.join(missing)})")
    meta = json.loads((path / EXPORT_RECORD).read_text())
    if meta.get("format") != NATIVE_FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r} is not {NATIVE_FORMAT!r}")
    try:
        cfg = load_config(path / "config.toml", recorded=True).model
    except ConfigError as e:
        raise ValueError(f"{path / 'config.toml'}: {e}") from e
    model, _ = build_on_meta(lambda: Transformer(cfg))  # no init: every weight is loaded
    weights = path / "model.safetensors"
    assign_weights(model, load_file(str(weights)), weights)
    return model.eval()
