"""The load-time checks of a typed config: choices, ranges, and the combinations that cannot
run (heads that do not divide the width, a run directory inside a source...), each refused
with a ConfigError naming the key and the fix, before any work starts."""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.config_changes import flat_settings
from kiln.config_suggestions import suggest
from kiln.data.prepare_checks import validate_prepare
from kiln.data.sources import printable_name
from kiln.errors import ConfigError

if TYPE_CHECKING:
    from kiln.config import Config

MAX_SEQ_LEN = 1 << 20  # positions; far beyond what one device trains on
MIN_VOCAB = 257  # 256 byte symbols + end-of-text
MAX_VOCAB = 1 << 22  # over ten times any vocabulary in use; the BPE trainer allocates for it
INT64 = 1 << 63  # TOML's integers are 64-bit (tomllib reads larger ones), as torch's and numpy's


_CHOICES = {
    "optim.name": ("adamw", "muon"),
    "optim.muon_adjust_lr": ("original", "match_rms_adamw"),
    "optim.muon_ns_dtype": ("auto", "bf16", "fp32"),
    "tokenizer.kind": ("bpe", "math"),
    "model.balance": ("smebu", "sign", "none"),
    "model.attn_kernel": ("auto", "sdpa", "matmul"),
    "schedule.name": ("cosine", "wsd", "constant"),
    "train.precision": ("auto", "fp32", "bf16"),
    "train.device": ("auto", "cpu", "cuda"),
    "train.parallel": ("ddp", "fsdp"),
    "eval.split": ("train", "val"),
}

# other names users give a choice, which spelling alone misses, or maps to the wrong one
# (`gpu` is one letter from 'cpu': the suggestion named the device the user did not want)
_CHOICE_NAMES = {
    "train.device": {"gpu": "cuda"},
    "train.precision": {"float32": "fp32", "bfloat16": "bf16"},
    "eval.split": {"validation": "val", "valid": "val", "validate": "val"},
}


def check_run_dir_is_its_own(cfg: Config) -> None:
    """The verbs that make a run's data (prepare, tokenizer, tokenize, run) need a folder of
    its own: prepare empties parts of it. The verbs that train on or read a made run
    (train, eval, generate, export, report) may be run from inside it (`kiln report .`)."""
    if not cfg.run.dir.strip() or Path(cfg.run.dir).resolve() == Path.cwd().resolve():
        raise ConfigError(f"run.dir: '{cfg.run.dir}' is the current folder; name a folder of "
                          "its own (prepare clears parts of it), e.g. runs/my-run")


def _resolved(key: str, path: str) -> Path:
    """`path` made absolute; links that point at each other are a config error (Python
    3.11-3.12 raise on them in resolve(), 3.13 returns the path: stat tells on all)."""
    try:
        resolved = Path(path).resolve()
        os.stat(path)
    except RuntimeError as e:
        raise ConfigError(f"{key} '{path}' is a symlink loop ({e})") from e
    except OSError as e:  # missing (a run dir not made yet) is fine; the verb reports the rest
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{key} '{path}' is a symlink loop ({e})") from e
    return resolved


def _check_run_dir(cfg: Config) -> None:
    """The run dir must be a folder, and a run dir inside a source would be read back as
    data (and its outputs overwrite the source)."""
    if not cfg.run.dir.strip():
        raise ConfigError("run.dir is empty; name a folder, e.g. runs/my-run")
    run = _resolved("run.dir", cfg.run.dir)
    if run.exists() and not run.is_dir():
        raise ConfigError(f"run.dir: '{cfg.run.dir}' is a file, not a folder")
    # a folder to be made under a file would fail deep in the first verb that writes
    above = next((p for p in run.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"run.dir: '{cfg.run.dir}' lies under '{above}', which is a file, "
                          "not a folder; set run.dir to a path under a folder")
    for i, source in enumerate(cfg.data.sources):
        if not source.strip():  # Path("") is the current folder: read whole, or "overlap"
            raise ConfigError(f"data.sources[{i}] is empty: name a file or folder ('.' for "
                              "the current one), or give data.sources = [] for the standard "
                              "library")
        src = _resolved("data.sources entry", source)
        if src == run or src.is_relative_to(run) or run.is_relative_to(src):
            raise ConfigError(f"run.dir '{cfg.run.dir}' and data.sources entry '{source}' "
                              "overlap: the run would overwrite its sources or read its own "
                              "outputs as data; put the run dir elsewhere")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes Python could not decode
        return False
    return True


def validate(cfg: Config) -> Config:
    """Reject impossible combinations, naming the key and the fix."""
    if not 0 <= cfg.run.seed < 2**63:  # numpy's generators take no negative seed, torch no larger
        raise ConfigError(f"run.seed must be in [0, 2**63), got {cfg.run.seed}")
    for key, choices in _CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in choices:
            meant = _CHOICE_NAMES.get(key, {}).get(value.lower())
            hint = f" (did you mean '{meant}'?)" if meant else suggest(value, choices)
            raise ConfigError(f"{key}: '{value}' is not one of {list(choices)}{hint}")
    m, t = cfg.model, cfg.train
    positive = {
        "model.dim": m.dim, "model.n_layers": m.n_layers, "model.n_heads": m.n_heads,
        "model.n_kv_heads": m.n_kv_heads, "model.max_seq_len": m.max_seq_len,
        "train.steps": t.steps, "train.seq_len": t.seq_len, "train.global_batch": t.global_batch,
        "train.micro_batch": t.micro_batch, "tokenizer.vocab_size": cfg.tokenizer.vocab_size,
        "optim.lr": cfg.optim.lr, "train.log_every": t.log_every,
        "eval.batch_size": cfg.eval.batch_size, "model.init_std": m.init_std,
        "model.norm_eps": m.norm_eps, "model.rope_theta": m.rope_theta,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    non_negative = {  # 0 means off, auto or everything
        "eval.max_batches": cfg.eval.max_batches,
        "eval.next_token_positions": cfg.eval.next_token_positions,
        "tokenizer.min_frequency": cfg.tokenizer.min_frequency,
        "model.ffn_hidden": m.ffn_hidden, "data.max_bytes": cfg.data.max_bytes,
        "train.eval_every": t.eval_every, "train.eval_batches": t.eval_batches,
        "train.checkpoint_every": t.checkpoint_every, "train.keep_checkpoints": t.keep_checkpoints,
        "generate.max_new_tokens": cfg.generate.max_new_tokens,
        "optim.weight_decay": cfg.optim.weight_decay, "optim.grad_clip": cfg.optim.grad_clip,
        "model.n_experts": m.n_experts, "model.n_dense_layers": m.n_dense_layers,
        "model.n_shared": m.n_shared, "model.expert_hidden": m.expert_hidden,
        "model.local_per_global": m.local_per_global, "model.sliding_window": m.sliding_window,
        "model.post_norm_gain": m.post_norm_gain, "model.head_dim": m.head_dim,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    for key, value in flat_settings(cfg).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not _is_utf8(text):
                raise ConfigError(f"{key}: '{printable_name(text)}' is not valid UTF-8 (a path with "
                                  "bytes from another encoding?); the run's config.toml cannot "
                                  "record it: rename it, or link to it under a UTF-8 name")
    _check_run_dir(cfg)
    if m.head_dim:
        if m.head_dim % 2:
            raise ConfigError(f"model.head_dim ({m.head_dim}) must be even for rotary embeddings")
    elif m.dim % m.n_heads:
        raise ConfigError(f"model.dim ({m.dim}) must be divisible by model.n_heads ({m.n_heads}), "
                          "or set model.head_dim")
    elif (m.dim // m.n_heads) % 2:
        raise ConfigError("model.dim / model.n_heads must be even for rotary embeddings "
                          "(or set an even model.head_dim)")
    if m.n_heads % m.n_kv_heads:
        raise ConfigError(
            f"model.n_heads ({m.n_heads}) must be a multiple of model.n_kv_heads ({m.n_kv_heads})"
        )
    if m.max_seq_len > MAX_SEQ_LEN:
        raise ConfigError(f"model.max_seq_len ({m.max_seq_len}) is over {MAX_SEQ_LEN:,}: the "
                          "rotary tables alone would not fit in memory")
    o = cfg.optim
    if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1):
        raise ConfigError(f"optim.beta1 and optim.beta2 must be in [0, 1), got {o.beta1} and "
                          f"{o.beta2}")
    if o.eps <= 0:
        raise ConfigError(f"optim.eps must be > 0, got {o.eps}")
    for key, value, ok, rule in (  # one key per message, with its value, as [model]'s
            ("muon_momentum", o.muon_momentum, 0 <= o.muon_momentum < 1, "in [0, 1)"),
            ("muon_ns_steps", o.muon_ns_steps, o.muon_ns_steps >= 1, ">= 1"),
            ("muon_lr", o.muon_lr, o.muon_lr >= 0,
             ">= 0 (0 picks 0.02 for muon_adjust_lr = 'original', optim.lr for 'match_rms_adamw')"),
            ("muon_weight_decay", o.muon_weight_decay, o.muon_weight_decay >= 0, ">= 0")):
        if not ok:
            raise ConfigError(f"optim.{key} = {value} must be {rule}")
    if m.local_per_global and m.sliding_window <= 0:
        raise ConfigError("model.local_per_global > 0 needs model.sliding_window > 0")
    if m.vocab_size and not MIN_VOCAB <= m.vocab_size <= MAX_VOCAB:
        raise ConfigError(f"model.vocab_size must be 0 (the tokenizer's) or from {MIN_VOCAB} to "
                          f"{MAX_VOCAB:,}, got {m.vocab_size:,}")
    for key, value, ok, rule in (
            ("route_scale", m.route_scale, m.route_scale > 0, "> 0"),
            ("balance_rate", m.balance_rate, m.balance_rate >= 0, ">= 0"),
            ("smebu_beta", m.smebu_beta, 0 <= m.smebu_beta < 1, "in [0, 1)"),
            ("smebu_kappa", m.smebu_kappa, m.smebu_kappa > 0, "> 0"),
            ("seq_aux_coef", m.seq_aux_coef, m.seq_aux_coef >= 0, ">= 0 (0 is off)"),
            ("z_loss_coef", m.z_loss_coef, m.z_loss_coef >= 0, ">= 0 (0 is off)"),
            ("router_init_std", m.router_init_std, m.router_init_std >= 0, ">= 0")):
        if not ok:
            raise ConfigError(f"model.{key} = {value} must be {rule}")
    if m.n_experts:
        if not 1 <= m.top_k <= m.n_experts:
            raise ConfigError(f"model.top_k ({m.top_k}) must be in [1, model.n_experts={m.n_experts}]")
        if m.n_dense_layers > m.n_layers:
            raise ConfigError(f"model.n_dense_layers = {m.n_dense_layers} exceeds model.n_layers "
                              f"= {m.n_layers}: use fewer dense layers than layers, so some are MoE")
    if t.seq_len > m.max_seq_len:
        raise ConfigError(f"train.seq_len ({t.seq_len}) exceeds model.max_seq_len ({m.max_seq_len})")
    if not MIN_VOCAB <= cfg.tokenizer.vocab_size <= MAX_VOCAB:
        raise ConfigError(f"tokenizer.vocab_size must be from {MIN_VOCAB} (256 byte symbols + "
                          f"end-of-text) to {MAX_VOCAB:,} (the trainer allocates for the whole "
                          f"vocabulary up front), got {cfg.tokenizer.vocab_size:,}")
    if cfg.tokenizer.kind == "math":
        from kiln.data.math_tokenizer import min_math_vocab

        smallest = min_math_vocab()
        if cfg.tokenizer.vocab_size < smallest:
            raise ConfigError(f"tokenizer.vocab_size ({cfg.tokenizer.vocab_size}) is too small for "
                              f"tokenizer.kind = 'math': it must hold the 256 byte symbols, EOS "
                              f"and the LaTeX seed tokens, {smallest} in all")
    if not cfg.data.text_field.strip():
        raise ConfigError("data.text_field is empty: name the record field (and parquet "
                          "column) that holds the text, e.g. data.text_field = \"content\"")
    if not 0.0 < cfg.data.val_fraction < 1.0:  # validation, eval and bits/byte need a val split
        raise ConfigError(f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
    if cfg.schedule.warmup_steps < 0:
        raise ConfigError("schedule.warmup_steps must be >= 0")
    if not 0.0 <= cfg.schedule.min_lr_ratio <= 1.0:
        raise ConfigError("schedule.min_lr_ratio must be in [0, 1]")
    if not 0.0 < cfg.schedule.decay_fraction <= 1.0:
        raise ConfigError("schedule.decay_fraction must be in (0, 1]")
    g = cfg.generate
    if not g.prompts:
        raise ConfigError("generate.prompts is empty: give at least one prompt")
    for key, value, ok, rule in (("temperature", g.temperature, g.temperature >= 0, ">= 0 (0 is greedy)"),
                                 ("top_p", g.top_p, 0 < g.top_p <= 1, "in (0, 1] (1 is off)"),
                                 ("top_k", g.top_k, g.top_k >= 0, ">= 0 (0 is off)")):
        if not ok:
            raise ConfigError(f"generate.{key} = {value} must be {rule}")
    validate_prepare(cfg.prepare)
    for key, value in flat_settings(cfg).items():  # after the checks that name a key's own range
        if isinstance(value, int) and not isinstance(value, bool) and \
                not -INT64 <= value < INT64:  # 1e22 steps trained "forever"
            raise ConfigError(f"{key} = {value:,} is past the 64-bit integers TOML holds: "
                              "from -2**63 to 2**63 - 1")
    return cfg
