"""Peak host memory of building a model and wrapping it for training: built on the CPU and
then placed (the way before `meta_init`), against built on the meta device and initialised
where it lands (`kiln.parallel.meta_init`), with the same seed and bitwise the same weights.

Each case runs in fresh processes: one plain process, and 2 gloo ranks under torchrun with
FSDP2 and with DDP. The figure is each rank's peak resident memory (VmHWM) less its peak just
before the build (imports, process group); the largest rank's is reported.

    python benchmarks/build_memory.py           # dim 768, 12 layers, 32k vocab: ~540 MB fp32
    python benchmarks/build_memory.py --quick   # a ~40 MB model
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MEMORY_SHAPES as SHAPES  # noqa: E402
from common import peak_rss_mb, result_line  # noqa: E402


def child(way: str, kind: str, shape: str) -> None:
    """One rank: build, wrap, print its figures as a JSON file."""
    import torch
    import torch.distributed as dist

    from kiln.config import ModelConfig
    from kiln.model import Transformer
    from kiln.parallel.distributed import DistEnv
    from kiln.parallel.meta_init import build_on_meta
    from kiln.parallel.model_wrapping import parallelize

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    env = DistEnv(rank, world, rank, launched=world > 1)
    if world > 1:
        dist.init_process_group("gloo")
    cfg = ModelConfig(**SHAPES[shape])
    before = peak_rss_mb()
    torch.manual_seed(0)
    if way == "cpu":
        model = parallelize(Transformer(cfg), kind, env, device=torch.device("cpu"))
    else:
        raw, init = build_on_meta(lambda: Transformer(cfg))
        model = parallelize(raw, kind, env, device=torch.device("cpu"), init=init)
    peak = peak_rss_mb()
    held = sum(getattr(p, "_local_tensor", p).numel() * 4 for p in model.parameters()) / 2**20
    full = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    row = {"rank": rank, "build_mb": peak - before, "held_mb": held, "model_mb": full}
    Path(os.environ["BUILD_MEMORY_OUT"], f"{rank}.json").write_text(json.dumps(row))
    if world > 1:
        dist.destroy_process_group()


def run_case(way: str, kind: str, ranks: int, shape: str) -> list[dict]:
    args = [__file__, "--child", way, kind, "--shape", shape]
    if ranks > 1:
        args = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
                f"--master_port={_free_port()}", *args]
    out_dir = tempfile.mkdtemp()
    env = {**os.environ, "BUILD_MEMORY_OUT": out_dir, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                         check=False, timeout=600)
    rows = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("*.json"))]
    shutil.rmtree(out_dir)
    if out.returncode != 0 or len(rows) != ranks:
        sys.exit(f"{way} {kind} x{ranks} failed:\n{out.stderr[-3000:]}")
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~40 MB model")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "KIND"), help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="full", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.shape)
        return
    shape = "quick" if args.quick else "full"
    figures: dict[str, float] = {}
    print(f"{'case':<14} {'way':<5} {'model MB':>9} {'held MB':>8} {'build peak MB (max rank)':>25}")
    for name, kind, ranks in (("one", "ddp", 1), ("fsdp2", "fsdp", 2), ("ddp2", "ddp", 2)):
        for way in ("cpu", "meta"):
            rows = run_case(way, kind, ranks, shape)
            peak = max(r["build_mb"] for r in rows)
            figures[f"{name}_{way}_mb"] = peak
            print(f"{name:<14} {way:<5} {rows[0]['model_mb']:>9.0f} {rows[0]['held_mb']:>8.0f} "
                  f"{peak:>25.0f}")
        figures["model_mb"] = rows[0]["model_mb"]
    figures["fsdp2_meta_over_cpu"] = figures["fsdp2_meta_mb"] / figures["fsdp2_cpu_mb"]
    print(result_line(**figures))


if __name__ == "__main__":
    main()
