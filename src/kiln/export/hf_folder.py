"""What every Hugging Face export writes: config, safetensors weights, generation config and
tokenizer, assembled beside the destination and swapped in only when complete."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.atomic import atomic_dir
from kiln.data.tokenizer import eos_id, load_tokenizer
from kiln.export.hf_tokenizer import write_hf_tokenizer
from kiln.export_recovery import EXPORT_RECORD
from kiln.model.transformer import Transformer
from kiln.tensor_files import save_tensors

# every file `write_hf_folder` writes (Llama and afmoe alike)
HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", EXPORT_RECORD)


def is_tied(model: Transformer) -> bool:
    return model.head.weight is model.embed.weight


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def generation_config(eos: int, tokenizer_vocab: int, model_vocab: int) -> dict[str, Any]:
    """generation_config.json. A vocabulary padded past the tokenizer's (model.vocab_size)
    has rows no tokenizer can decode, yet `generate` would sample them and the text would
    silently lose them: `suppress_tokens` makes transformers' generate mask them to -inf
    (its SuppressTokensLogitsProcessor), as `kiln generate` does, while the model's logits
    stay those Kiln computes."""
    out: dict[str, Any] = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    if model_vocab > tokenizer_vocab:
        out["suppress_tokens"] = list(range(tokenizer_vocab, model_vocab))
    return out


def write_hf_folder(
    model: Transformer,
    tokenizer_path: Path,
    out_dir: Path,
    config: Callable[[Transformer, int], dict[str, Any]],
    state_dict: Callable[[Transformer], dict[str, torch.Tensor]],
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write `config(model, eos)` and `state_dict(model)` with the tokenizer into `out_dir`;
    an existing export is replaced only by a complete one. `provenance` (format, checkpoint)
    goes to `kiln_export.json`, which transformers ignores."""
    tokenizer_path, out_dir = Path(tokenizer_path), Path(out_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    eos = eos_id(tokenizer)
    if eos >= model.cfg.vocab_size:
        raise ValueError(f"EOS id {eos} is outside the model's vocabulary ({model.cfg.vocab_size})")
    with atomic_dir(out_dir) as tmp:
        _write_json(tmp / "config.json", config(model, eos))
        save_tensors(state_dict(model), tmp / "model.safetensors", metadata={"format": "pt"})
        _write_json(tmp / "generation_config.json",
                    generation_config(eos, tokenizer.get_vocab_size(), model.cfg.vocab_size))
        write_hf_tokenizer(tokenizer_path, tmp, model.cfg.max_seq_len)
        if provenance:
            _write_json(tmp / EXPORT_RECORD, provenance)
    return out_dir
