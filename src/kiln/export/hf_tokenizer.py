"""Tokenizer files that `transformers.AutoTokenizer` loads as a fast (Rust) tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kiln.data.tokenizer import EOS_TOKEN


def write_hf_tokenizer(tokenizer_path: Path, out_dir: Path, max_len: int) -> None:
    """Copy tokenizer.json and describe it for transformers.

    Kiln encodes a literal "<|endoftext|>" in raw text as plain bytes (only the data pipeline
    inserts EOS, by id); `split_special_tokens` asks transformers to do the same, so both
    tokenizers give the same ids for any string. Kiln has no BOS: EOS doubles as BOS and pad.
    """
    shutil.copyfile(tokenizer_path, out_dir / "tokenizer.json")
    specials = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
