"""`kiln export`: the latest checkpoint as a Hugging Face or Kiln native folder, replacing
the previous export whole (its other files set aside, a killed export's swap finished)."""

from __future__ import annotations

import sys

from kiln.config import Config
from kiln.errors import KilnError


def cmd_export(cfg: Config) -> None:
    from safetensors import SafetensorError

    from kiln.data.provenance import run_tokenizer, tokenizer_path
    from kiln.export import export_model
    from kiln.export.earlier import other_files_set_aside
    from kiln.export_recovery import is_whole_export, recover_export
    from kiln.train.trained_run import load_trained_model

    model, ckpt = load_trained_model(cfg)
    run_tokenizer(cfg.run_dir)
    out = cfg.run_dir / "export"
    recovered = recover_export(out, cfg.run_dir)  # the previous export, back before it is replaced
    if recovered:
        print(f"note: {recovered}", file=sys.stderr)
    try:
        with other_files_set_aside(out, cfg.run_dir) as moved:  # the export replaces it whole
            result = export_model(model, tokenizer_path(cfg.run_dir), out, cfg, ckpt.name)
    except (FileNotFoundError, PermissionError):  # each has its own advice
        raise
    except (OSError, SafetensorError) as e:  # a full disk: in safetensors' writer or ours
        kept = "the previous export is intact" if is_whole_export(out) else "nothing was exported"
        raise KilnError(f"cannot write {out} ({type(e).__name__}: {e}): is the disk full or "
                        f"read-only? {kept}; free space and run `kiln export` again") from e
    if moved:
        print(f"note: {moved}", file=sys.stderr)
    print(f"export ({result.format}): {ckpt.name} -> {result.path} ({result.note})")
