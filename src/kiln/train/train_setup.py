"""What a run's settings, processes and data must agree on before its model is built, and
the notes said about them (micro-batches fitted to the ranks, threads, passes over the
data, the data and design the run records).

Why its own: the trainer's setup checks the settings against the run directory and the
launch before any weight is made; kept here, `Trainer.__init__` reads as the order things
are built in, and `kiln run` asks the same questions before its data stages.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import torch

from kiln.config import (
    Config,
    ConfigError,
    ModelConfig,
    TrainConfig,
    design_notes,
    design_problems,
)
from kiln.data.loader import TokenLoader, TokenStream, counts_only
from kiln.data.prepare_signature import prepare_settings_differ
from kiln.data.provenance import data_settings_differ
from kiln.data.shards import load_index
from kiln.errors import alike_on_every_rank
from kiln.parallel.distributed import DistEnv
from kiln.train.schedule import schedule_warnings


def model_config_for_run(cfg: Config, token_dir: Path):
    """The model config with the vocabulary taken from the token shards."""
    vocab = load_index(token_dir)["vocab_size"]
    if cfg.model.vocab_size and cfg.model.vocab_size < vocab:
        raise ConfigError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's ({vocab}, "
            f"{Path(token_dir) / 'index.json'}): set model.vocab_size = 0 to take the tokenizer's"
        )
    return dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or vocab)


def fit_micro_batch(global_batch: int, micro_batch: int, world_size: int) -> int:
    """The largest micro-batch <= train.micro_batch that splits each rank's share of the
    global batch evenly. micro_batch only bounds memory (the step's gradient is the same),
    so a recipe made for one process runs unchanged on several."""
    if global_batch % world_size:
        raise ConfigError(f"train.global_batch ({global_batch}) must be divisible by the number "
                          f"of ranks ({world_size})")
    per_rank = global_batch // world_size
    if micro_batch >= per_rank:
        return per_rank
    # at most ~sqrt(per_rank) tries: trying every size up to a micro_batch of 1e9 took minutes
    # of silence before the memory check could refuse it
    root = math.isqrt(per_rank)
    if micro_batch <= root:
        return next(m for m in range(micro_batch, 0, -1) if per_rank % m == 0)
    largest_small = 1
    for d in range(1, root + 1):  # per_rank // d, the divisors above the root, descending
        if per_rank % d == 0:
            if per_rank // d <= micro_batch:
                return per_rank // d
            largest_small = d
    return largest_small


def check_splits(token_dir: Path, seq_len: int) -> None:
    """Both splits must hold a window of seq_len + 1 tokens before training starts (a val
    split without one would fail only after all the steps, before the final checkpoint)."""
    index = load_index(token_dir)
    documents = index["train"]["documents"] + index["val"]["documents"]
    for split in ("val", "train"):
        tokens = TokenStream(token_dir, split).n_tokens
        if tokens >= seq_len + 1:
            continue
        if documents < 2:
            fix = (f"the data holds {documents} document(s) and the split is by whole "
                   "document, so add documents (or split the text into several files)")
        else:
            fix = (f"the split is by whole document (train has {index['train']['documents']}, "
                   f"val {index['val']['documents']}): change data.val_fraction or run.seed and "
                   "re-run `kiln tokenize`, add data, or lower train.seq_len")
        raise ConfigError(f"the {split} split has {tokens} tokens, fewer than one window of "
                          f"train.seq_len + 1 = {seq_len + 1}: {fix}")



def note_settings(cfg: Config, env: DistEnv, device: torch.device, micro_batch: int) -> None:
    """Notes and warnings on how the settings run here: the micro-batch fitted to the ranks,
    FSDP without torchrun, one thread per rank, a schedule that does not fit the steps."""
    t = cfg.train
    if micro_batch != t.micro_batch and env.is_main:
        share = (f"{env.world_size} ranks share" if env.distributed
                 else "one process runs")
        print(f"note: {share} train.global_batch = {t.global_batch}: each runs "
              f"micro-batches of {micro_batch} (train.micro_batch = {t.micro_batch} is "
              "the most one runs at once)", file=sys.stderr)
    if t.parallel == "fsdp" and not env.distributed:  # ddp is the default: said only
        print("note: train.parallel = 'fsdp' applies under torchrun (torchrun "  # if asked
              "--nproc_per_node=N -m kiln train RUN); one process trains the model unwrapped",
              file=sys.stderr)
    if env.is_main and device.type == "cpu":
        note_threads()
    if env.is_main:
        for warning in schedule_warnings(t.steps, cfg.schedule):
            print(f"warning: {warning}", file=sys.stderr)


def note_threads() -> None:
    """torchrun sets OMP_NUM_THREADS=1 for several processes unless told otherwise: on
    CPU each rank then uses one core however many the machine has."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = os.cpu_count() or 1
    if ranks_here > 1 and torch.get_num_threads() == 1 and cores >= 2 * ranks_here:
        print(f"note: each of the {ranks_here} ranks on this machine computes on 1 thread "
              f"(OMP_NUM_THREADS=1, torchrun's default) of {cores} cores; launch with "
              f"OMP_NUM_THREADS={cores // ranks_here} to use them all", file=sys.stderr)


def note_data_use(loader: TokenLoader, token_dir: Path, t: TrainConfig, is_main: bool) -> None:
    """Notes on the train split as the steps will use it: shards checked by their sizes
    alone, fewer windows than one batch, more than one pass over the data."""
    if counts_only(loader.stream.index) and is_main:
        print(f"note: {token_dir / 'index.json'} was written before Kiln hashed each "
              "shard's contents: only their sizes are checked, so shards changed in place or "
              "re-made with the same counts go unnoticed (re-run `kiln tokenize` to record "
              "the hashes, before training or with `kiln train --fresh`)", file=sys.stderr)
    if loader.n_windows < t.global_batch and is_main:
        print(f"note: the train split holds {loader.n_windows} windows of "
              f"train.seq_len = {t.seq_len}, fewer than one batch of train.global_batch = "
              f"{t.global_batch}: every step repeats windows within its batch (more data, "
              "or a smaller global_batch)", file=sys.stderr)
    elif t.steps * t.global_batch > loader.n_windows and is_main:
        # past one pass the loader wraps and reshuffles without a word: a run sized by
        # steps can repeat its data many times over (overfitting a small corpus)
        passes = t.steps * t.global_batch / loader.n_windows
        print(f"note: train.steps = {t.steps} of train.global_batch = {t.global_batch} "
              f"windows make {passes:.2f} passes over the train split's "
              f"{loader.n_windows} windows of train.seq_len = {t.seq_len} (each pass "
              "in a new order): the model sees its data more than once", file=sys.stderr)


def check_data_and_design(cfg: Config, model_cfg: ModelConfig, run_dir: Path, step: int,
                          is_main: bool) -> None:
    """The settings against the run's data and design, met alike on every rank: a new model
    (`step` 0) records its settings, so they must describe its data, and a refused design is
    refused; a run trained so goes on as it was, with a note."""
    with alike_on_every_rank():
        if step == 0:  # a new model records its settings: they must describe its data
            t = cfg.tokenizer
            differ = prepare_settings_differ(cfg.prepare, run_dir, cfg.data.sources,
                                             cfg.data.max_bytes, cfg.data.text_field)
            differ += data_settings_differ(run_dir, cfg.run.seed, cfg.data.val_fraction, {
                "kind": t.kind, "vocab_size": t.vocab_size, "min_frequency": t.min_frequency})
            if differ:
                raise ConfigError(
                    f"the data in {run_dir} was made with other settings "
                    f"({'; '.join(differ)}): train on it with those, or re-make it "
                    "(`kiln prepare` / `kiln tokenizer` / `kiln tokenize`, or `kiln run`) first")
        for problem in design_problems(model_cfg):
            if step == 0:  # a new model: refused; a run trained so goes on as it was
                raise ConfigError(problem)
            if is_main:
                print(f"note: {problem} (this run was trained so; it resumes as it was)",
                      file=sys.stderr)
    if step == 0 and is_main:  # said once, when the model is made
        for line in design_notes(model_cfg, cfg.train.seq_len):
            print(f"note: {line}", file=sys.stderr)
