"""`kiln eval`: loss, perplexity and bits per byte of the latest checkpoint on a split,
written to the run directory and set against the unigram baseline; with them, from the same
forward pass, the next-token concentration (`kiln.eval.concentration`) and each window's
loss (`kiln.eval.window_losses`, for `kiln report --compare`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.config import Config, flat_settings, recorded_config
from kiln.errors import CheckpointError, KilnError, RunDataError, alike_on_every_rank

if TYPE_CHECKING:
    from kiln.parallel.distributed import DistEnv


def _rank_zeros_checkpoint(cfg: Config, env: DistEnv) -> Path | None:
    """Under torchrun, the checkpoint rank 0 finds latest, for every rank (None: one process,
    which looks itself): a trainer of the run writes checkpoints while it is evaluated, and
    ranks reading `latest` a moment apart each scored another model, their losses summed
    into one figure. None found by rank 0 is none for every rank (each looked again: one
    that found the trainer's first checkpoint meanwhile read it while rank 0 failed). By
    name: `run.dir` may be mounted at other paths."""
    if not env.distributed:
        return None
    import torch.distributed as dist

    from kiln.train.checkpoint_dirs import latest_checkpoint
    from kiln.train.trained_run import no_checkpoint

    found = latest_checkpoint(cfg.run_dir / "checkpoints") if env.is_main else None
    name = [None if found is None else found.name]
    dist.broadcast_object_list(name, src=0)
    if name[0] is None:
        with alike_on_every_rank():
            raise no_checkpoint(cfg.run_dir)
    return cfg.run_dir / "checkpoints" / name[0]


def _refuse_other_copies(cfg: Config, env: DistEnv, ckpt: Path) -> None:
    """Ranks reading their own copies of the run (a node's own disk) may hold other files
    under the checkpoint's name (a stale copy, another run's) or other token shards (one
    node's re-made since), each valid: each rank would score its own model on its own
    windows, summed into one figure. Their checksums.json and shards must be the same."""
    from kiln.data.loader import shards_fingerprint
    from kiln.data.shards import INDEX, load_index
    from kiln.hashing import file_sha256
    from kiln.parallel.rank_copies import ONE_COPY, copies_held
    from kiln.train.checkpoint import CHECKSUMS

    sums = ckpt / CHECKSUMS
    held = copies_held(env, file_sha256(sums) if sums.is_file() else None)
    if held is not None:
        with alike_on_every_rank():  # every rank gathered the same copies
            raise CheckpointError(
                f"the ranks hold different copies of checkpoint {ckpt.name} (their {CHECKSUMS} "
                f"differ: {held}; rank {env.rank}'s is {ckpt}): {ONE_COPY}")
    tokens = cfg.run_dir / "tokens"
    held = copies_held(env, shards_fingerprint(load_index(tokens)))
    if held is not None:
        with alike_on_every_rank():
            raise RunDataError(f"the ranks hold different token shards (their {tokens / INDEX} "
                               f"differ: {held}): {ONE_COPY}")


def _load_told(e: BaseException) -> str:
    """How a rank's failure to load the checkpoint is told, after "rank R"."""
    if isinstance(e, KeyboardInterrupt):
        return "was interrupted while it read the checkpoint"
    if isinstance(e, KilnError):
        return f"could not evaluate: {e}"
    return f"could not read the checkpoint ({type(e).__name__}: {e})"


def _record_told(e: BaseException) -> str:
    """How rank 0's failure to write eval.json is told on the other ranks."""
    if isinstance(e, KeyboardInterrupt):
        return "rank 0 was interrupted while it wrote the evaluation"
    if isinstance(e, KilnError):
        return str(e)
    return f"rank 0 could not write the evaluation ({type(e).__name__}: {e})"


def cmd_eval(cfg: Config, distributed: bool = False) -> None:
    """`distributed`: under torchrun, the ranks share the windows and rank 0 reports (`kiln
    run` evaluates on rank 0 alone, after training has closed the process group)."""
    import torch

    from kiln.atomic import write_json_atomic
    from kiln.data.loader import TokenStream
    from kiln.data.shards import load_index
    from kiln.eval import eval_file, perplexity_text
    from kiln.eval.concentration import concentration_text
    from kiln.eval.perplexity import evaluate
    from kiln.eval.window_losses import split_sha256, write_window_losses
    from kiln.parallel.distributed import DistEnv, init_distributed, local_device, shutdown
    from kiln.parallel.rank_waits import run_on_every_rank, run_on_main
    from kiln.train.precision import resolve_device, resolve_precision
    from kiln.train.trained_run import load_trained_model

    device = resolve_device(cfg.train.device)
    env = init_distributed(device, flat_settings(cfg)) if distributed else DistEnv()
    device = local_device(device, env)
    try:
        agreed = _rank_zeros_checkpoint(cfg, env)
        # every rank reads the same checkpoint, but one may fail alone (a trainer pruning it
        # meanwhile, a node's own copy): agreed, so rank 0 says why where a failed rank past
        # the first of its node said nothing and the others met a lost rank. The split's
        # shards are hashed here too (minutes on a copy not checked yet; `evaluate` opens
        # them again without): a rank done first waited in a blocking collective, deaf to
        # SIGTERM, and a node's damaged copy was a lost rank to the others
        def load() -> tuple[Any, Path]:
            found = load_trained_model(cfg, agreed)
            TokenStream(cfg.run_dir / "tokens", cfg.eval.split)
            return found

        with alike_on_every_rank():
            model, ckpt = run_on_every_rank(env, load, _load_told, CheckpointError)
        _refuse_other_copies(cfg, env, ckpt)
        precision = resolve_precision(cfg.train.precision, device)
        model.to(device)
        e = cfg.eval
        with torch.inference_mode():
            result = evaluate(model, cfg.run_dir / "tokens", e.split, cfg.train.seq_len,
                              e.batch_size, e.max_batches, device, precision, env,
                              doc_mask=cfg.model.doc_mask, details=True,
                              next_token_positions=e.next_token_positions)
        name = eval_file(e.split)

        def record() -> None:  # rank 0's alone
            index = load_index(cfg.run_dir / "tokens")
            result["unigram_bpb"] = index["unigram_bpb"]
            result["split_sha256"] = split_sha256(index, e.split)  # which tokens the windows hold
            if "window_losses" in result:  # written first: eval.json records the file's hash
                result["window_losses"] = write_window_losses(cfg.run_dir, e.split,
                                                              result.pop("window_losses"))
            result["checkpoint"], result["ranks"] = ckpt.name, env.world_size
            result["batch_size"], result["max_batches"] = e.batch_size, e.max_batches
            result["seq_len"], result["precision"] = cfg.train.seq_len, precision
            write_json_atomic(cfg.run_dir / name, result)

        # before the group closes: the other ranks wait for it, and fail with rank 0 where
        # they had exited 0 while rank 0 exited 1
        run_on_main(env, record, _record_told, KilnError)
    finally:
        shutdown(env)
    if not env.is_main:
        return
    trained = recorded_config(cfg.run_dir)
    if trained is not None and trained.train.seq_len != cfg.train.seq_len:
        print(f"note: scored with {cfg.train.seq_len}-token windows; the model trained on "
              f"{trained.train.seq_len} (recorded in {name})", file=sys.stderr)
    baseline = result.get("unigram_bpb_scored")
    if baseline is not None:  # the baseline on exactly the tokens scored, whatever the split
        verdict = "below" if result["bpb"] < baseline else "NOT below"
        against = f"{verdict} the unigram baseline {baseline:.4f} on the same tokens"
    elif e.split == "val" and not e.max_batches:
        verdict = "below" if result["bpb"] < result["unigram_bpb"] else "NOT below"
        against = f"{verdict} the unigram baseline {result['unigram_bpb']:.4f}"
    else:  # shards from before the counts were saved: the baseline is the whole val split's
        against = (f"the whole val split's unigram baseline is {result['unigram_bpb']:.4f}, "
                   "not measured on these tokens: re-run `kiln tokenize` for one that is")
    print(f"eval ({e.split}): loss {result['loss']:.4f}, "
          f"perplexity {perplexity_text(result['perplexity'])}, "
          f"{result['bpb']:.4f} bits/byte ({against})")
    if "next_token" in result:
        print(f"eval ({e.split}) next-token concentration: "
              f"{concentration_text(result['next_token'])}")
