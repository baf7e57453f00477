"""Export trained Kiln models to other ecosystems (Hugging Face transformers)."""

from kiln.export.hf_llama import export_hf, hf_config, hf_state_dict

__all__ = ["export_hf", "hf_config", "hf_state_dict"]
