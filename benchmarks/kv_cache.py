"""Decoding speed of `kiln generate`'s preallocated KV cache against the old cat-grown one
and Hugging Face's `generate` on the exported model.

The same model (dim 512, 6 layers, 8 heads / 4 kv heads, vocab 8192, context 1024 or --context, fp32)
decodes greedily from a 16-token prompt, once for each length. Contenders, interleaved in
rounds (each round runs all of them, in rotating order); tokens/s are medians:

- `kiln`: `kiln.model.sampling.generate` as it ships (buffers for prompt + new tokens
  allocated once, written in place);
- `cat`: the same `generate` with every layer's cache swapped for the old one, which grew
  its keys and values with `torch.cat` every step (kept here only, as the peer);
- `hf`: `transformers.LlamaForCausalLM.generate` (its dynamic cache, SDPA) on Kiln's HF
  export of the same weights, `min_new_tokens` so it never stops early.

    python benchmarks/kv_cache.py             # 256 new tokens and the full context
    python benchmarks/kv_cache.py --quick     # tiny model, smoke test
    python benchmarks/kv_cache.py --context 512  # a shorter full context
    python benchmarks/kv_cache.py --threads 1 # steadier on a machine shared with others
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, result_line, set_threads  # noqa: E402

from kiln.config import ModelConfig  # noqa: E402
from kiln.export.hf_llama import hf_config, hf_state_dict  # noqa: E402
from kiln.model import Transformer  # noqa: E402
from kiln.model.sampling import generate  # noqa: E402

PROMPT = 16


class CatCache:
    """The cache `kiln generate` used before: every step concatenates the new key and value
    onto all those held, copying the whole cache (O(n^2) copying over a generation)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def hf_model(model: Transformer) -> torch.nn.Module:
    """LlamaForCausalLM holding the export's config and weights (as `kiln export` writes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = hf_config(model, eos=0)
    cfg.pop("architectures"), cfg.pop("model_type")
    hf = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa"))
    hf.load_state_dict(hf_state_dict(model), strict=False)  # a tied head is re-tied by HF
    return hf.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: every core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024, help="the model's max_seq_len")
    a = ap.parse_args()
    threads = set_threads()
    if a.threads > 0:
        torch.set_num_threads(threads := a.threads)
    size = (dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, max_seq_len=128)
            if a.quick else
            dict(dim=512, n_layers=6, n_heads=8, n_kv_heads=4, vocab_size=8192, max_seq_len=a.context))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**size)).eval()
    hf = hf_model(model)
    prompt = torch.randint(0, size["vocab_size"], (PROMPT,)).tolist()
    lengths = [min(256, size["max_seq_len"] // 2), size["max_seq_len"] - PROMPT]

    def kiln(n: int) -> list[int]:
        return generate(model, prompt, n, temperature=0.0)

    def cat(n: int) -> list[int]:
        real = model.new_caches
        model.new_caches = lambda *_: [CatCache() for _ in model.layers]
        try:
            return generate(model, prompt, n, temperature=0.0)
        finally:
            model.new_caches = real

    def hf_generate(n: int) -> list[int]:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)
        return out[0, PROMPT:].tolist()

    runs = {"kiln": kiln, "cat": cat, "hf": hf_generate}
    figures: dict[str, float] = {}
    print(f"threads={threads} model={size} prompt={PROMPT} rounds={a.rounds}")
    for run in runs.values():  # warm-up
        run(8)
    for n in lengths:
        times: dict[str, list[float]] = {name: [] for name in runs}
        tokens: dict[str, list[int]] = {}
        names = list(runs)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                start = time.perf_counter()
                tokens[name] = runs[name](n)
                times[name].append(time.perf_counter() - start)
        assert tokens["kiln"] == tokens["cat"], "the caches must decode the same tokens"
        agree = sum(x == y for x, y in zip(tokens["kiln"], tokens["hf"]))
        tps = {name: n / median(t) for name, t in times.items()}
        print(f"new tokens {n}: " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in tps.items())
              + f"; greedy tokens equal to HF's: {agree}/{n}")
        figures[f"kiln_tokens_per_s_{n}"] = tps["kiln"]
        figures[f"speedup_vs_cat_{n}"] = tps["kiln"] / tps["cat"]
        figures[f"speedup_vs_hf_{n}"] = tps["kiln"] / tps["hf"]
        figures[f"hf_agree_{n}"] = agree / n
    print(result_line(**figures, threads=threads))


if __name__ == "__main__":
    main()
