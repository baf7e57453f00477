"""Export trained Kiln models to other ecosystems (Hugging Face transformers).

`export_model` picks the format: a plain Llama config -> `LlamaForCausalLM`; a Trinity-style
config afmoe represents exactly -> `AfmoeForCausalLM`; anything else -> Kiln's native
safetensors folder, with the reason recorded and returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.config import Config, ModelConfig
from kiln.export.hf_afmoe import afmoe_available, afmoe_incompatibilities, export_afmoe
from kiln.export.hf_llama import export_hf, hf_config, hf_state_dict, llama_incompatibilities
from kiln.export.native import export_native, load_native
from kiln.model.transformer import Transformer


@dataclass(frozen=True)
class ExportResult:
    format: str  # "hf-llama" | "hf-afmoe" | "kiln-native"
    path: Path
    note: str  # why this format (for the native fallback: what the HF formats cannot hold)


def export_model(
    model: Transformer, tokenizer_path: Path, out_dir: Path, config: Config,
    checkpoint: str | None = None,
) -> ExportResult:
    """Export `model` (`config`: its run's config) in the most portable exact format;
    `checkpoint` (its name) is recorded in the folder's kiln_export.json."""
    not_llama = llama_incompatibilities(model.cfg)
    if not not_llama:
        return ExportResult("hf-llama", export_hf(model, tokenizer_path, out_dir, checkpoint),
                            "plain Llama: load with transformers.AutoModelForCausalLM"
                            + doc_mask_note(model.cfg))
    not_afmoe = afmoe_incompatibilities(model.cfg)
    unavailable = afmoe_available()
    if not not_afmoe and unavailable is None:
        return ExportResult("hf-afmoe", export_afmoe(model, tokenizer_path, out_dir, checkpoint),
                            "Trinity/afmoe: load with transformers.AutoModelForCausalLM"
                            + doc_mask_note(model.cfg))
    why = not_afmoe or [unavailable]
    reason = (f"no Hugging Face format holds this model exactly: not Llama ({'; '.join(not_llama)})"
              f" and not afmoe ({'; '.join(why)})")
    path = export_native(model, tokenizer_path, out_dir, config, reason, checkpoint)
    return ExportResult("kiln-native", path, reason + "; load with kiln.export.load_native")


def doc_mask_note(cfg: ModelConfig) -> str:
    """What a Hugging Face export of a model trained with `model.doc_mask` should be told:
    transformers' Llama and afmoe attend causally across EOS (they make no document mask from
    input ids), which is the trained function for one document per sequence with no EOS
    before it. Not for `generate()` without a prompt: it starts from EOS (the bos_token),
    and every later token then sees that EOS, which in training (and `kiln generate`, which
    shows it to the first token alone) belongs to the previous document: the samples drift
    from the second token on. Packed documents need a per-document attention mask of the
    caller's. The export stays valid, so it is said, not refused."""
    if not cfg.doc_mask:
        return ""
    return ("; trained with intra-document masking (model.doc_mask): transformers masks "
            "causally only, so the export is exact for one document per sequence with no EOS "
            "before it: generate() without a prompt starts from EOS (its bos_token), which "
            "every later token then sees, unlike in training and `kiln generate` (prompt it "
            "with the document's first tokens instead); pass packed documents with a "
            "per-document attention mask of your own")


__all__ = ["doc_mask_note", "ExportResult", "export_afmoe", "export_hf", "export_model", "export_native",
           "hf_config", "hf_state_dict", "load_native"]
