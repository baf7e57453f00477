"""Typed configuration: a dataclass tree loaded from TOML, overridable with `--set a.b=c`.

Every key is checked at load time: unknown keys, wrong types and impossible combinations
raise `ConfigError` naming the key (and the closest valid key), so a typo never silently
falls back to a default halfway through a run.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import json
import math
import os
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.config_aliases import alias_hint
from kiln.data.prepare_config import PrepareConfig, unused_option_tables, validate_prepare
from kiln.data.sources import printable_name
from kiln.errors import ConfigError  # re-exported: `from kiln.config import ConfigError` works
from kiln.inert_settings import inert_settings

MAX_SEQ_LEN = 1 << 20  # positions; far beyond what one device trains on
MIN_VOCAB = 257  # 256 byte symbols + end-of-text
MAX_VOCAB = 1 << 22  # over ten times any vocabulary in use; the BPE trainer allocates for it


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


def _suggest(key: str, valid: typing.Iterable[str]) -> str:
    valid = list(valid)
    same_letters = [v for v in valid if isinstance(key, str) and v.lower() == key.lower()]
    close = same_letters or difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _suggest_key(full: str) -> str:
    """For an unknown dotted key: the same name in other sections (`train.lr` ->
    `optim.lr`), then the closest name in its own section, then the closest anywhere."""
    section, _, name = full.rpartition(".")
    leaves = list(flat_settings(Config()))
    foreign = alias_hint(name, section, set(leaves))  # `n_embd`, `max_steps`, `dropout`...
    if foreign:
        return f" ({foreign})"
    if not section:  # a section name (`[trian]`), or a setting outside its table (`steps = 3`)
        # `run_dir` for `run.dir`: an underscore typed for the dot comes first
        dotted = [d for i in range(len(name)) if name[i] == "_"
                  for d in [f"{name[:i]}.{name[i + 1:]}"] if d in leaves]
        placed = list(dict.fromkeys(dotted + [k for k in leaves
                                              if k.rpartition(".")[2] == name]))[:2]
        if placed:
            return f" (did you mean {' or '.join(repr(p) for p in placed)}?)"
        return _suggest(name, [f.name for f in dataclasses.fields(Config)])
    tables = [".".join(k.split(".")[:i]) for k in leaves for i in range(2, k.count(".") + 1)]
    keys = list(dict.fromkeys(leaves + tables))  # `prepare.quality` is a key too
    by_name = [k for k in keys if k.rpartition(".")[2] == name and k != full]
    own = [k for k in keys if k.rpartition(".")[0] == section]
    near = [f"{section}.{c}" for c in difflib.get_close_matches(
        name, [k.rpartition(".")[2] for k in own], n=1)]
    anywhere = difflib.get_close_matches(name, [k.rpartition(".")[2] for k in keys], n=1)
    near += [k for k in keys if anywhere and k.rpartition(".")[2] == anywhere[0]][:1]
    picks = list(dict.fromkeys(by_name + near))[:2]
    return f" (did you mean {' or '.join(repr(p) for p in picks)}?)" if picks else ""


def _as_list(text: str) -> list[str]:
    """The list a string was meant to be, for the suggestion: `[my_corpus/]` or `[a, b]` is
    a list written with bare words (TOML could not read it, so it stayed a string), not one
    item that starts with a bracket."""
    inner = text.strip()
    if not inner.startswith("["):
        return [text]
    items = (item.strip().strip("'\"").strip() for item in inner[1:].removesuffix("]").split(","))
    return [item for item in items if item]


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check `value` against a type hint; ints widen to floats, nothing else is guessed."""
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            items = _as_list(value) if isinstance(value, str) else []
            example = f"{key}={json.dumps(items)}" if items else f"{key}=[...]"
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r} "
                              f"(on the command line: --set '{example}')")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):
            try:
                return _coerce(value, arm, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {value!r} does not match {hint}")
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{key}: expected nothing, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or not isinstance(value, hint):
        raise ConfigError(f"{key}: expected {hint.__name__}, got {type(value).__name__} "
                          f"{value!r}{_toml_hint(value, hint, key)}")
    return value


def _toml_hint(value: Any, hint: type, key: str) -> str:
    """What TOML wanted when a number or boolean was written the Python way (`.5`, `True`),
    or text was written bare and read as a number, date or boolean (`run.dir=2024-06-01`)."""
    if hint is str and not isinstance(value, str | dict | list):
        if "[" in key or isinstance(value, float):  # a list item; a float's spelling is lost
            return " (text is quoted in TOML)"
        spelled = str(value).lower() if isinstance(value, bool) else (
            value.isoformat() if hasattr(value, "isoformat") else str(value))
        return (f' (text is quoted in TOML: {key}="{spelled}"; on the command line, where the '
                f"shell eats bare quotes: --set '{key}=\"{spelled}\"')")
    if not isinstance(value, str):
        return ""
    if hint is bool and value.lower() in ("true", "false"):
        return f" (TOML booleans are lowercase: {value.lower()})"
    if hint in (int, float):
        try:
            number = float(value)
        except ValueError:
            return ""
        if hint is int and number.is_integer():
            return f" (as a TOML number: {int(number)})"
        return f" (as a TOML number: {number!r})"
    return ""


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'{_suggest_key(full)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a [{full}] table, got {value!r}")
            kwargs[key] = _build(hint, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, hint, full)
    return cls(**kwargs)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    if not all(part.strip() for part in key.split(".")):  # `=3`, `train..steps=3`
        raise ConfigError(f"override '{text}' must look like section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string: --set train.precision=bf16
    return [part.strip() for part in key.split(".")], value


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    """Merge `a.b=value` overrides into a raw TOML dict (values parsed as TOML). A table
    (`train={steps=5}`) is merged into the section, key by key, as `train.steps=5` would be:
    put in its place, it dropped the recipe's other keys of that section for their defaults."""
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
        _merge(node, path[-1], value)
    return data


def _merge(node: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(node.get(key), dict):
        for k, v in value.items():
            _merge(node[key], k, v)
    else:
        node[key] = value


def run_dir_overrides(overrides: typing.Iterable[str]) -> list[str]:
    """The overrides that set run.dir, however written (`run.dir=...`, `run={dir=...}`)."""
    out = []
    for text in overrides:
        path, value = _parse_override(text)
        if path == ["run", "dir"] or (path == ["run"] and isinstance(value, dict)
                                      and "dir" in value):
            out.append(text)
    return out


def flat_settings(cfg: Config) -> dict[str, Any]:
    """Every setting by dotted key (`prepare.quality.domain`), nested sections included."""
    return _flat(dataclasses.asdict(cfg))


def _flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict (settings, or a raw TOML table) by dotted key."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out


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
    for source in cfg.data.sources:
        src = _resolved("data.sources entry", source)
        if src == run or src.is_relative_to(run) or run.is_relative_to(src):
            raise ConfigError(f"run.dir '{cfg.run.dir}' and data.sources entry '{source}' "
                              "overlap: the run would overwrite its sources or read its own "
                              "outputs as data; put the run dir elsewhere")


def validate(cfg: Config) -> Config:
    """Reject impossible combinations, naming the key and the fix."""
    if not 0 <= cfg.run.seed < 2**63:  # numpy's generators take no negative seed, torch no larger
        raise ConfigError(f"run.seed must be in [0, 2**63), got {cfg.run.seed}")
    for key, choices in _CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in choices:
            raise ConfigError(f"{key}: '{value}' is not one of {list(choices)}{_suggest(value, choices)}")
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
        "eval.max_batches": cfg.eval.max_batches, "tokenizer.min_frequency": cfg.tokenizer.min_frequency,
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
    return cfg


def design_problems(m: ModelConfig) -> list[str]:
    """Model designs that load and run but train something other than they say. A new model
    is refused them (`kiln train` / `kiln run` with no checkpoint, or `--fresh`); a run
    trained so before Kiln checked keeps working (its checkpoints still resume, evaluate,
    generate and export), with a note."""
    problems = []
    if m.sliding_window and not m.local_per_global:
        problems.append(f"model.sliding_window = {m.sliding_window} has no effect with "
                        "model.local_per_global = 0 (every layer global): set local_per_global "
                        "to the number of local layers before each global one")
    if m.local_per_global and m.local_per_global >= m.n_layers:
        problems.append(f"model.local_per_global = {m.local_per_global} with model.n_layers = "
                        f"{m.n_layers} leaves no global layer (the pattern is "
                        f"{m.local_per_global} sliding-window layers, then one global): use a "
                        "smaller local_per_global or more layers")
    if m.local_per_global and m.sliding_window >= m.max_seq_len:
        # a query at position i sees keys i - W + 1 .. i; with W >= max_seq_len that is every
        # earlier key of any sequence the model takes, so the "local" layers are global ones
        # (with RoPE) and the ablation would compare global against global
        problems.append(f"model.sliding_window = {m.sliding_window} is not below model.max_seq_len "
                        f"= {m.max_seq_len}: every position is inside the window, so the local "
                        "layers attend to the whole sequence; use a window below max_seq_len "
                        "(Trinity: max_seq_len / 2), or local_per_global = 0 for all-global layers")
    if m.n_experts and m.n_dense_layers >= m.n_layers:
        # is_moe_layer: layer i is MoE when i >= n_dense_layers, so none is
        problems.append(f"model.n_dense_layers = {m.n_dense_layers} with model.n_layers = "
                        f"{m.n_layers} leaves no MoE layer (the first n_dense_layers layers "
                        f"are dense, the rest MoE): model.n_experts = {m.n_experts} does "
                        "nothing and the model is dense; use n_dense_layers below n_layers "
                        "(Trinity Nano: 2 of 56), or n_experts = 0 for a dense model")
    if m.n_experts and m.top_k == 1:
        problems.append("model.top_k = 1: the gates of a token's chosen experts are normalised "
                        "to sum to model.route_scale, so a lone expert's gate is constant and the "
                        "router learns nothing from the loss; use top_k >= 2 (and "
                        "model.n_experts >= 2)")
    return problems


def design_notes(m: ModelConfig) -> list[str]:
    """Designs that train what they say but perhaps not what was meant: said once, when a
    new model starts (a published model may choose them: Gemma 3 1B's 26 layers at 5 local
    : 1 global end on two local layers)."""
    notes = _cut_pattern_note(m)
    if m.n_experts >= 2 and m.top_k == m.n_experts and m.n_dense_layers < m.n_layers:
        # every expert is chosen, so the selection bias (smebu / sign) changes nothing, and the
        # sequence-wise aux loss is constant: its load fractions are all 1 / n_experts
        balancing = [f"model.balance = {m.balance!r}"] if m.balance != "none" else []
        balancing += ["model.seq_aux_coef"] if m.seq_aux_coef else []
        inert = (f" and load balancing ({', '.join(balancing)}) has nothing to balance"
                 if balancing else "")
        notes.append(f"model.top_k = model.n_experts = {m.n_experts}: every token goes to every "
                     f"expert, so each MoE layer costs all its experts per token{inert}; for a "
                     "sparse MoE use top_k below n_experts (Trinity: 8 of 128)")
    return notes


def _cut_pattern_note(m: ModelConfig) -> list[str]:
    """The note for a local/global attention pattern that n_layers cuts short."""
    period = m.local_per_global + 1
    if not m.local_per_global or m.local_per_global >= m.n_layers or m.n_layers % period == 0:
        return []  # all global, no global layer (a design problem), or whole repetitions
    tail, full = m.n_layers % period, m.n_layers - m.n_layers % period
    # model.transformer.is_local_layer: layer i is global when (i + 1) % period == 0
    glob = list(range(period - 1, m.n_layers, period))
    listed = (f"layer {glob[0]} is" if len(glob) == 1 else
              f"layers {glob[0]} and {glob[1]} are" if len(glob) == 2 else
              f"layers {glob[0]}, {glob[1]}, ..., {glob[-1]} are")
    last = f"layer {m.n_layers - 1} is" if tail == 1 else f"layers {full}-{m.n_layers - 1} are"
    return [f"model.n_layers = {m.n_layers} is not a multiple of model.local_per_global + 1 = "
            f"{period}: the pattern ({m.local_per_global} sliding-window "
            f"layer{'s' if m.local_per_global > 1 else ''}, then one "
            f"global) is cut short, so {listed} global and the last {last} local; for a "
            f"global last layer use n_layers = {full} or {full + period}"]


# config_to_toml's first line: a file that starts so lists every setting, not those a user gave
RECORD_HEADER = "# Kiln's resolved config: every setting, defaults included"


# the settings that name a file or folder
PATH_KEYS = ("run.dir", "data.sources", "prepare.decontaminate.benchmarks",
             "prepare.inject_replicas.benchmark", "prepare.perplexity.run_dir",
             "prepare.brain_rot_m1.tokenizer", "prepare.arxiv.snapshot", "prepare.arxiv.source_dir")


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
    if b2.judge.startswith("kiln:"):  # a run directory after the prefix
        b2 = dataclasses.replace(b2, judge="kiln:" + os.path.expanduser(b2.judge[len("kiln:"):]))
        cfg = dataclasses.replace(cfg, prepare=dataclasses.replace(cfg.prepare, brain_rot_m2=b2))
    return cfg


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = (),
                recorded: bool = False) -> Config:
    """Load a TOML file (or the defaults), apply `--set` overrides, type-check and validate.
    Settings given (in the file or an override) that the rest of the config leaves unused
    are warned of. `recorded`: the file is a config.toml Kiln wrote (a run's, an export's;
    before RECORD_HEADER marked them), which lists every key, so only the overrides count
    as given."""
    overrides = list(overrides)
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"no recipe or run directory at {path}")
        try:
            text = path.read_text(encoding="utf-8-sig")  # a BOM from Windows editors
            data = tomllib.loads(text)
            recorded = recorded or text.startswith(RECORD_HEADER)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not a TOML recipe (not UTF-8 text: {e.reason})") from e
    given = set() if recorded else _given_keys(data)
    data = apply_overrides(data, overrides)
    given |= set(_flat(apply_overrides({}, overrides)))  # cannot fail where the above did not
    cfg = validate(_home_expanded(_build(Config, data, "")))
    for line in inert_settings(cfg, given):
        warnings.warn(line, stacklevel=2)  # the CLI prints `warning: ...` once, on rank 0
    return cfg


def _given_keys(data: dict[str, Any]) -> set[str]:
    """The keys of a recipe a user wrote. A file listing most of Kiln's keys is a recorded
    config.toml (an older Kiln's has no RECORD_HEADER; a user may copy one to edit it): there
    only the values that differ from the defaults were chosen."""
    flat = _flat(data)
    defaults = _flat(config_to_dict(Config()))
    if len(flat.keys() & defaults.keys()) < 0.75 * len(defaults):
        return set(flat)
    return {k for k, v in flat.items() if k not in defaults or v != defaults[k]}


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes for quotes, backslashes and control characters,
    but not its surrogate pairs (`\\ud83d\\udd25` for an emoji, which TOML refuses), so
    characters outside ASCII stay as they are; DEL, which JSON leaves bare, is escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes Python could not decode
        return False
    return True


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def run_dir_override(run_dir: Path | str) -> str:
    """`run.dir=...` for any path."""
    return f"run.dir={toml_string(str(run_dir))}"


def recorded_config(run_dir: Path) -> Config | None:
    """The config a run recorded (its config.toml), or None: none yet, or one recorded by an
    older Kiln with settings since refused."""
    try:
        return load_config(Path(run_dir) / "config.toml", [run_dir_override(run_dir)],
                           recorded=True)
    except ConfigError:
        return None


# the settings the data (documents, tokenizer, shards) is made from
DATA_KEYS = ("data.", "prepare.", "tokenizer.", "run.seed")
# prepare settings that change how the data is made, not what: a resume stays valid
EXECUTION_KEYS = ("executor", "workers", "resume", "slurm_partition", "slurm_time",
                  "cpus_per_task", "mem_per_cpu_gb", "console_logs")


def data_changes(old: Config, new: Config) -> list[str]:
    """'key: old -> new' for the settings that change what data is made (not how, nor
    whether rejected documents are also kept for inspection, nor the options of a stage
    that neither runs: the documents' fingerprint leaves those out too)."""
    how = {f"prepare.{k}" for k in (*EXECUTION_KEYS, "keep_rejected")}
    unused = tuple(f"prepare.{t}." for t in
                   unused_option_tables(old.prepare.stages, new.prepare.stages))
    before, after = flat_settings(old), flat_settings(new)
    return [c for c in config_changes(old, new, DATA_KEYS) if (key := c.split(":")[0]) not in how
            and not key.startswith(unused) and not _same_paths(before.get(key), after.get(key))]


def _same_paths(a: object, b: object) -> bool:
    """`d`, `d/`, `./d` and its absolute path name one existing file or folder: the same
    data setting (what the files hold is compared by the prepare's input fingerprint)."""
    a, b = ([a], [b]) if isinstance(a, str) and isinstance(b, str) else (a, b)
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)):
        return False
    return all(isinstance(x, str) and isinstance(y, str) and x and y and os.path.exists(x)
               and os.path.realpath(x) == os.path.realpath(y) for x, y in zip(a, b))


def config_changes(old: Config, new: Config, prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """'key: old -> new' for every setting under `prefixes` (dotted) that differs."""
    before, after = flat_settings(old), flat_settings(new)
    return [f"{k}: {before.get(k)!r} -> {v!r}" for k, v in after.items()
            if k.startswith(prefixes) and v != before.get(k)]


def config_to_toml(cfg: Config) -> str:
    """Serialise the resolved config; `load_config` of the result gives the same config."""
    lines: list[str] = [RECORD_HEADER]

    def table(name: str, values: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items() if not isinstance(v, dict))
        lines.append("")
        for k, v in values.items():
            if isinstance(v, dict):  # a nested dataclass: its own [section.sub] table
                table(f"{name}.{k}", v)

    for section, values in config_to_dict(cfg).items():
        table(section, values)
    return "\n".join(lines)
