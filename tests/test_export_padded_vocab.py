"""An export of a model whose vocabulary is padded past the tokenizer's: transformers'
`generate` never samples the padded ids (they decode to nothing), and the logits the
model computes are still Kiln's, padded rows included."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub import

import pytest  # noqa: E402
import torch  # noqa: E402
from test_export import tiny_model, tokenizer_path  # noqa: E402, F401  (the fixture)

from kiln.data.tokenizer import load_tokenizer  # noqa: E402
from kiln.export import export_hf  # noqa: E402

transformers = pytest.importorskip("transformers")

PAD = 64  # padded rows past the tokenizer's vocabulary


def padded_model(vocab: int):
    """The tokenizer's vocabulary plus PAD rows, the padded rows' logits the largest by far:
    unsuppressed, nearly every draw would be a padded id."""
    model = tiny_model(vocab + PAD, tied=False)
    with torch.no_grad():
        model.head.weight[vocab:] *= 20
    return model


def test_hf_generate_on_a_padded_export_never_samples_a_padded_id(tokenizer_path, tmp_path):  # noqa: F811
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    model = padded_model(vocab)
    out = export_hf(model, tokenizer_path, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    prompts = torch.randint(0, vocab, (8, 4))
    with torch.no_grad():
        # the logits are unchanged: padded ids are the likeliest there, as in Kiln's model
        logits = hf(prompts).logits
        torch.testing.assert_close(logits, model(prompts), atol=1e-4, rtol=1e-4)
        assert (logits[:, -1].argmax(-1) >= vocab).all()
        torch.manual_seed(0)
        sampled = hf.generate(prompts, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=40, min_new_tokens=40, eos_token_id=None)
        greedy = hf.generate(prompts, do_sample=False, max_new_tokens=8, min_new_tokens=8)
    new = torch.cat([sampled[:, 4:], greedy[:, 4:]], dim=1)
    assert new.numel() == 8 * 48 and int(new.max()) < vocab
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == list(range(vocab, vocab + PAD))
