"""Time and peak host memory of loading a trained model for eval, generate and export: built
on the CPU with its random init and then overwritten from the checkpoint (the way before,
kept here as the peer), against built with its parameters on the meta device and given the
loaded tensors in their place (`kiln.train.trained_run.loaded_model`).

A checkpoint's model.safetensors (with its checksums.json, as Kiln writes them) is saved once
to a temporary folder; each load runs in a fresh process, the two ways alternating (A B,
then B A). The figures are the load's seconds and the process's peak resident memory
(VmHWM) less its peak just before the load (the imports); medians over the rounds. Both
ways are checked to give bitwise the same tensors.

    python benchmarks/load_memory.py           # dim 768, 12 layers, 32k vocab: ~490 MB fp32
    python benchmarks/load_memory.py --quick   # a ~40 MB model
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MEMORY_SHAPES as SHAPES  # noqa: E402
from common import median, peak_rss_mb, result_line  # noqa: E402


def save(ckpt: Path, shape: str) -> float:
    """A checkpoint's weights as `kiln train` writes them; returns their MB."""
    import torch

    from kiln.config import ModelConfig
    from kiln.hashing import file_sha256
    from kiln.model import Transformer
    from kiln.tensor_files import save_tensors
    from kiln.train.checkpoint import CHECKSUMS
    from kiln.train.checkpoint_weights import model_tensors

    torch.manual_seed(0)
    tensors = model_tensors(Transformer(ModelConfig(**SHAPES[shape])))
    ckpt.mkdir(parents=True)
    save_tensors(tensors, ckpt / "model.safetensors")
    sums = {"model.safetensors": file_sha256(ckpt / "model.safetensors")}
    (ckpt / CHECKSUMS).write_text(json.dumps(sums))
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20


def child(way: str, ckpt: Path, shape: str) -> None:
    """One load, its figures printed as JSON (and a digest of the weights, to compare)."""
    import torch

    from kiln.config import ModelConfig
    from kiln.model import Transformer
    from kiln.train.checkpoint import load_weights
    from kiln.train.trained_run import loaded_model

    cfg = ModelConfig(**SHAPES[shape])
    before = peak_rss_mb()
    start = time.perf_counter()
    if way == "cpu":  # the way before: a random init, overwritten
        model = Transformer(cfg)
        load_weights(ckpt, model)
    else:
        model = loaded_model(cfg, ckpt)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    with torch.no_grad():
        digest = sum(float(t.double().sum()) * (i + 1) for i, t in enumerate(model.state_dict().values()))
    print(json.dumps({"s": seconds, "load_mb": peak - before, "digest": digest}))


def run_child(way: str, ckpt: Path, shape: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, __file__, "--child", way, str(ckpt), "--shape", shape],
                         capture_output=True, text=True, env=env, check=False, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{way} load failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~40 MB model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("WAY", "CKPT"), help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="full", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), args.shape)
        return
    shape = "quick" if args.quick else "full"
    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "step_00000001"
        model_mb = save(ckpt, shape)
        rows: dict[str, list[dict]] = {"cpu": [], "meta": []}
        for r in range(args.rounds):  # cpu meta, then meta cpu: neither always goes first
            for way in list(rows) if r % 2 == 0 else list(rows)[::-1]:
                rows[way].append(run_child(way, ckpt, shape))
    digests = {r["digest"] for way in rows for r in rows[way]}
    if len(digests) != 1:
        sys.exit(f"the two ways loaded other weights: digests {sorted(digests)}")
    figures: dict[str, float] = {"model_mb": model_mb}
    print(f"{'way':<5} {'model MB':>9} {'load s':>7} {'load peak MB':>13}")
    for way, got in rows.items():
        figures[f"{way}_s"] = median([r["s"] for r in got])
        figures[f"{way}_mb"] = median([r["load_mb"] for r in got])
        print(f"{way:<5} {model_mb:>9.0f} {figures[f'{way}_s']:>7.2f} {figures[f'{way}_mb']:>13.0f}")
    figures["meta_over_cpu_s"] = figures["meta_s"] / figures["cpu_s"]
    figures["meta_over_cpu_mb"] = figures["meta_mb"] / figures["cpu_mb"]
    print(result_line(**figures))


if __name__ == "__main__":
    main()
