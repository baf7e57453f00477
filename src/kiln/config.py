"""Typed configuration: a dataclass tree loaded from TOML, overridable with `--set a.b=c`.

Every key is checked at load time: unknown keys, wrong types and impossible combinations
raise `ConfigError` naming the key (and the closest valid key), so a typo never silently
falls back to a default halfway through a run. This module holds the tree and `load_config`;
the reading (config_parse), the checks (config_checks, config_design), the suggestions
(config_suggestions), the TOML written (config_toml) and the comparisons (config_changes)
have modules of their own, and their public names are importable from here too.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tomllib
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.config_changes import (  # noqa: F401  (re-exported: imported from kiln.config)
    DATA_KEYS,
    EXECUTION_KEYS,
    config_changes,
    data_changes,
    flat_settings,
    flat_table,
)
from kiln.config_checks import (  # noqa: F401  (re-exported)
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MIN_VOCAB,
    check_run_dir_is_its_own,
    validate,
)
from kiln.config_design import design_notes, design_problems  # noqa: F401  (re-exported)
from kiln.config_parse import (  # noqa: F401  (re-exported)
    apply_overrides,
    build_config,
    run_dir_overrides,
)
from kiln.config_toml import (  # noqa: F401  (re-exported)
    RECORD_HEADER,
    config_to_dict,
    config_to_toml,
    run_dir_override,
    toml_string,
)
from kiln.data.prepare_config import KILN_JUDGE, PrepareConfig
from kiln.errors import ConfigError  # re-exported: `from kiln.config import ConfigError` works
from kiln.inert_settings import inert_settings


@dataclass
class RunConfig:
    dir: str = "runs/quickstart"  # the run directory: everything a run writes lives here
    seed: int = 0


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=list)  # empty: the Python standard library
    # per prepare task, not in all: each task's reader stops after the document that brings
    # its documents' text to this many UTF-8 bytes (0 = everything; see the README)
    max_bytes: int = 0
    val_fraction: float = 0.02  # fraction of documents held out for validation
    # the field of a .jsonl / .json record, or the column of a .parquet file, that holds the
    # document's text (`content`, `raw_content`...); the other fields go to metadata
    text_field: str = "text"


@dataclass
class TokenizerConfig:
    vocab_size: int = 4096
    min_frequency: int = 2
    kind: str = "bpe"  # bpe (byte-level) | math (digits split, LaTeX commands kept whole)


@dataclass
class ModelConfig:
    vocab_size: int = 0  # 0: taken from the trained tokenizer
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4  # grouped-query attention; == n_heads is plain multi-head
    # width of one attention head; 0: dim // n_heads. Trinity Large sets it apart from dim:
    # 48 query heads of 128 at dim 3072 (queries, gate and output projection are 6144 wide)
    head_dim: int = 0
    ffn_hidden: int = 0  # 0: 8/3 * dim rounded up to a multiple of 64 (SwiGLU)
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    # attention options (Trinity): all off gives the plain Llama decoder
    local_per_global: int = 0  # N local (sliding-window) layers, then 1 global; 0 = all global
    sliding_window: int = 0  # local layers attend to the last `sliding_window` positions
    global_rope: bool = True  # False: global layers use no positional encoding (NoPE)
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys, before RoPE
    attn_gate: bool = False  # elementwise sigmoid(x Wg) gate before the output projection
    # intra-document masking (Trinity Large): a token attends only to earlier tokens of its own
    # EOS-separated document in the packed window; positions are not reset (kiln.model.doc_mask)
    doc_mask: bool = False
    # causal attention kernel: auto = blocked batched matmuls for bf16 / fp32 training on CPU
    # while the kept probabilities stay small (faster than SDPA's CPU backward), SDPA otherwise
    attn_kernel: str = "auto"  # auto | sdpa | matmul
    # normalisation options (Trinity)
    sandwich_norm: bool = False  # post-norms on both sub-layer outputs as well as pre-norms
    post_norm_gain: float = 0.0  # initial post-norm gain; 0 = depth-scaled 1/sqrt(n_layers)
    embed_scale: bool = False  # multiply input embeddings by sqrt(dim)
    # mixture of experts (Trinity / DeepSeek-V3 sigmoid routing); n_experts = 0 is dense
    n_experts: int = 0
    n_dense_layers: int = 0  # the first layers keep a dense SwiGLU
    top_k: int = 2
    n_shared: int = 1
    expert_hidden: int = 0  # 0: ffn_hidden / 4 rounded to 64
    route_scale: float = 1.0
    balance: str = "smebu"  # smebu | sign | none
    balance_rate: float = 5e-4  # SMEBU lambda, or the sign rule's gamma
    smebu_beta: float = 0.5
    smebu_kappa: float = 2.0
    seq_aux_coef: float = 0.0
    z_loss_coef: float = 0.0
    router_init_std: float = 0.02


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # decoupled; never applied to norms, biases or 1-D gains
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # Muon (optim.name = "muon"): hidden 2-D and expert weights; the rest stays on AdamW
    muon_lr: float = 0.0  # 0: 0.02 for "original", optim.lr for "match_rms_adamw"
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    muon_adjust_lr: str = "original"  # original | match_rms_adamw
    muon_weight_decay: float = 0.1  # decoupled, times the unscaled Muon lr
    muon_ns_dtype: str = "auto"  # auto | bf16 | fp32


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | wsd | constant
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # final lr as a fraction of the peak
    decay_fraction: float = 0.2  # wsd: fraction of steps spent in the final decay


@dataclass
class TrainConfig:
    steps: int = 300
    seq_len: int = 128
    global_batch: int = 16  # sequences per optimizer step, over all ranks
    micro_batch: int = 16  # sequences per forward pass on one rank
    precision: str = "auto"  # auto | fp32 | bf16
    device: str = "auto"  # auto | cpu | cuda
    parallel: str = "ddp"  # used only under torchrun: ddp | fsdp
    compile: bool = False
    # on CPU, keep freed tensor memory in the process (glibc mallopt) instead of page-faulting
    # it in again every step; process-wide, and the resident size does not shrink back
    keep_host_memory: bool = True
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 20
    checkpoint_every: int = 100
    keep_checkpoints: int = 2  # the newest N complete checkpoints; 0 keeps them all


@dataclass
class EvalConfig:
    split: str = "val"
    batch_size: int = 16
    max_batches: int = 0  # 0: the whole split
    # positions the next-token concentration is measured on (evenly spaced windows; its sort
    # of each distribution costs ~10x the head's matmul at a 32k vocabulary); 0: not measured
    next_token_positions: int = 65_536


@dataclass
class GenerateConfig:
    prompts: list[str] = field(default_factory=lambda: ["def ", "The "])
    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir)


# the settings that name a file or folder
PATH_KEYS = ("run.dir", "data.sources", "prepare.decontaminate.benchmarks",
             "prepare.inject_replicas.benchmark", "prepare.perplexity.run_dir",
             "prepare.inject_replicas.tokenizer", "prepare.brain_rot_m1.tokenizer",
             "prepare.brain_rot_arms.tokenizer", "prepare.arxiv.snapshot",
             "prepare.arxiv.source_dir")


def _home_expanded(cfg: Config) -> Config:
    """A leading `~` in a path setting (`~/runs/x`) is the home folder, as a shell reads it
    unquoted: a recipe (or a quoted --set) left it literal, so a run made a folder named `~`
    in the current one, and a source or benchmark there was not found."""
    def expanded(obj: Any, parts: list[str]) -> Any:
        value = getattr(obj, parts[0])
        if len(parts) > 1:
            value = expanded(value, parts[1:])
        elif isinstance(value, list):
            value = [os.path.expanduser(v) for v in value]
        else:
            value = os.path.expanduser(value)
        return dataclasses.replace(obj, **{parts[0]: value})

    for key in PATH_KEYS:
        cfg = expanded(cfg, key.split("."))
    b2 = cfg.prepare.brain_rot_m2
    if b2.judge.startswith(KILN_JUDGE):  # a run directory after the prefix
        b2 = dataclasses.replace(
            b2, judge=KILN_JUDGE + os.path.expanduser(b2.judge[len(KILN_JUDGE):]))
        cfg = dataclasses.replace(cfg, prepare=dataclasses.replace(cfg.prepare, brain_rot_m2=b2))
    return cfg


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = (),
                recorded: bool = False) -> Config:
    """Load a TOML file (or the defaults), apply `--set` overrides, type-check and validate.
    Settings given (in the file or an override) that the rest of the config leaves unused
    are warned of. `recorded`: the file is a config.toml Kiln wrote (a run's, an export's;
    before RECORD_HEADER marked them), which lists every key, so only the overrides count
    as given. A file with the header counts so in a run directory alone: copied elsewhere
    to be edited, its edits were quiet (an edited muon_lr under adamw not warned of)."""
    overrides = list(overrides)
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"no recipe or run directory at {path}")
        try:
            text = path.read_text(encoding="utf-8-sig")  # a BOM from Windows editors
            data = tomllib.loads(text)
            # a run's own record (beside the env.json written with it) counts only the
            # overrides; one copied out as a recipe, the values edited or kept from the
            # copied run that differ from the defaults (`_given_keys`): those were chosen
            recorded = recorded or (text.startswith(RECORD_HEADER)
                                    and (path.parent / "env.json").is_file())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not a TOML recipe (not UTF-8 text: {e.reason})") from e
    given = set() if recorded else _given_keys(data)
    written = copy.deepcopy(data)  # the overrides merge into `data` in place
    data = apply_overrides(data, overrides)
    given |= set(flat_table(apply_overrides({}, overrides)))  # cannot fail where the above did not
    try:
        cfg = validate(_home_expanded(build_config(Config, data)))
    except ConfigError as e:
        raise _named_file(e, path, written) from e
    for line in inert_settings(cfg, given):
        warnings.warn(line, stacklevel=2)  # the CLI prints `warning: ...` once, on rank 0
    return cfg


def _named_file(e: ConfigError, path: Path | None, written: dict[str, Any]) -> ConfigError:
    """A mistake in the recipe itself (a misspelt section, a quoted number) said as the
    --set one is said, with no word of where it was: the recipe's is named, so the user
    opens the file rather than looking for it among their options."""
    if path is None:
        return e
    try:
        validate(_home_expanded(build_config(Config, written)))
    except ConfigError as alone:
        if str(alone) == str(e):
            return ConfigError(f"{path}: {e}")
    return e


def _given_keys(data: dict[str, Any]) -> set[str]:
    """The keys of a recipe a user wrote. A file listing most of Kiln's keys is a recorded
    config.toml (an older Kiln's has no RECORD_HEADER; a user may copy one to edit it): there
    only the values that differ from the defaults were chosen."""
    flat = flat_table(data)
    defaults = flat_table(config_to_dict(Config()))
    if len(flat.keys() & defaults.keys()) < 0.75 * len(defaults):
        return set(flat)
    return {k for k, v in flat.items() if k not in defaults or v != defaults[k]}


def recorded_config(run_dir: Path) -> Config | None:
    """The config a run recorded (its config.toml), or None: none yet, or one recorded by an
    older Kiln with settings since refused."""
    try:
        return load_config(Path(run_dir) / "config.toml", [run_dir_override(run_dir)],
                           recorded=True)
    except ConfigError:
        return None
