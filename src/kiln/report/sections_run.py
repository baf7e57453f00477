"""Report sections that describe the run: summary, config, environment, model, data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.report.fmt import (
    as_number,
    flat_rows,
    fmt_bytes,
    fmt_count,
    fmt_duration,
    fmt_float,
    fmt_flops,
    fmt_value,
)
from kiln.report.html_parts import grid_table, key_value_table, paragraph, pre, section, unavailable
from kiln.report.run_files import Loaded
from kiln.report.summary import Summary
from kiln.train.checkpoint_dirs import checkpoint_step

try:  # tomllib is stdlib from Python 3.11; on 3.10 the config is shown verbatim only
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    tomllib = None  # type: ignore[assignment]

CONFIG_HEADLINES = [
    ("model", "dim"),
    ("model", "n_layers"),
    ("model", "n_heads"),
    ("train", "steps"),
    ("train", "precision"),
]
ENV_HEADLINES = ["git_hash", "python", "torch", "platform", "device"]


def summary_section(metrics: Loaded, summary: Summary, latest: str | None = None,
                    training: str | None = None, config: Loaded | None = None) -> str:
    """The headline figures of the run, first thing on the page; with a note when the run
    logged steps past its latest checkpoint (`latest`), which a resume trains again, or,
    while a trainer holds the run (`training`: who), that it is training still. A diverged
    run's note says what to lower as the trainer did, from its `config` (config.toml)."""
    if not metrics.ok:
        return section("Summary", unavailable(metrics.problem or ""))
    s = summary
    saved = checkpoint_step(Path(latest)) if latest else None
    past = ""
    if s.diverged_step is not None:  # its last logged step alone would read as a killed run
        where = (f"its latest checkpoint, {latest}, is from before it" if saved
                 else "no checkpoint was written before it")
        what = f" ({s.diverged_what})" if s.diverged_what else ""
        past = paragraph(f"Training diverged at step {s.diverged_step}{what} and stopped there; "
                         f"{where}. {_divergence_advice(config)}, and run `kiln train` "
                         "to resume.", "bad")
    elif training is not None:  # its steps past the checkpoint are the run's newest, not lost
        ckpt = f"its latest checkpoint is {latest} (step {saved})" if saved else "no checkpoint yet"
        past = paragraph(f"The run is training now ({training}): these figures are its steps "
                         f"up to {'—' if s.last_step is None else s.last_step}; {ckpt}.", "muted")
    elif s.last_step is not None and (saved or 0) < s.last_step:
        where = (f"its latest checkpoint is {latest} (step {saved})" if saved
                 else "it has no checkpoint")
        past = paragraph(f"The run logged steps up to {s.last_step}, but {where}: it stopped "
                         "(was killed?) before saving the later steps, so a resume trains "
                         "them again and moves their records to archive/.", "missing")
    best = "—" if s.best_val_bpb is None else f"{s.best_val_bpb:.4f} (step {s.best_val_step})"
    rows = [
        ("last step", "—" if s.last_step is None else str(s.last_step)),
        ("final train loss", fmt_float(s.final_train_loss)),
        ("best val bpb", best),
        ("total tokens", fmt_count(s.total_tokens)),
        ("mean tokens/s (last half)", fmt_count(s.mean_tokens_per_s)),
        ("training time (to the last logged step)", fmt_duration(s.wall_time_s)),
    ]
    return section("Summary", past + key_value_table(rows))


def _divergence_advice(config: Loaded | None) -> str:
    """The trainer's advice for the run's optimizer settings (a Muon run's hidden matrices
    train at optim.muon_lr: "lower optim.lr" alone would not help them); the general words
    where config.toml is missing or does not read as Kiln's."""
    from kiln.config import OptimConfig
    from kiln.config_parse import build_config
    from kiln.train.divergence_advice import divergence_advice

    general = "Lower optim.lr or optim.grad_clip"
    try:
        table = tomllib.loads(config.value).get("optim", {})
        optim = build_config(OptimConfig, table, "optim.")
    except Exception:  # any damage: the page still gets made
        return general
    advice = divergence_advice(optim)
    return advice[:1].upper() + advice[1:]


def config_section(config: Loaded) -> str:
    """Headline settings, then the resolved config verbatim."""
    if not config.ok:
        return section("Configuration", unavailable(config.problem or ""))
    text = config.value
    parts = []
    if tomllib is not None:
        try:
            parsed = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            parts.append(paragraph(f"config.toml does not parse: {error}", "bad"))
        else:
            rows = [
                (f"{table}.{key}", fmt_value(parsed[table][key]))
                for table, key in CONFIG_HEADLINES
                if isinstance(parsed.get(table), dict) and key in parsed[table]
            ]
            if rows:
                parts.append(key_value_table(rows))
    parts.append(pre(text))
    return section("Configuration", "\n".join(parts))


def environment_section(env: Loaded) -> str:
    """Git hash, interpreter, torch, platform, device and package versions."""
    if not env.ok:
        return section("Environment", unavailable(env.problem or ""))
    data: dict[str, Any] = env.value
    rows = [(k, fmt_value(data[k])) for k in ENV_HEADLINES if k in data]
    rest = {k: v for k, v in data.items() if k not in ENV_HEADLINES and k != "versions"}
    rows += flat_rows(rest)
    versions = data.get("versions")
    if isinstance(versions, dict):
        rows += [(f"version: {pkg}", fmt_value(ver)) for pkg, ver in versions.items()]
    return section("Environment", key_value_table(rows))


def _launches_cell(launches: list) -> str:
    """'from step 1: fsdp on 2 ranks, bf16; from step 13: 1 process, bf16'."""
    parts = []
    for launch in launches:
        if not isinstance(launch, dict):
            return fmt_value(launches)
        ranks = launch.get("world_size")
        how = (f"{launch.get('parallel')} on {ranks} rank{'' if ranks == 1 else 's'}"
               if launch.get("parallel") != "none" else "1 process")
        parts.append(f"from step {launch.get('from_step')}: {how}, {launch.get('precision')}")
    return "; ".join(parts)


def _model_cell(key: str, value: Any) -> str:
    if key == "launches" and isinstance(value, list):
        return _launches_cell(value)
    if "flop" in key.lower() and as_number(value) is not None:
        return fmt_flops(value)
    if isinstance(value, int) and not isinstance(value, bool) and "param" in key.lower():
        return f"{fmt_count(value)} ({value:,})"
    return fmt_value(value)


def model_section(model: Loaded) -> str:
    """Parameter counts and FLOPs per token, in readable units."""
    if not model.ok:
        return section("Model", unavailable(model.problem or ""))
    rows = [(k, _model_cell(k, v)) for k, v in model.value.items() if not isinstance(v, dict)]
    rows += flat_rows({k: v for k, v in model.value.items() if isinstance(v, dict)})
    return section("Model", key_value_table(rows))


def data_section(prepare: Loaded) -> str:
    """Document counts and skip reasons from data preparation."""
    if not prepare.ok:
        return section("Data", unavailable(prepare.problem or ""))
    # each documents file's sha256 (kiln.data.prepared.HASHES): a record, not a figure
    shown = {k: v for k, v in prepare.value.items() if k != "documents_sha256"}
    return section("Data", key_value_table(flat_rows(shown)))


def tokens_section(index: Loaded) -> str:
    """Per-split documents, tokens and bytes of the token shards."""
    if not index.ok:
        return section("Token shards", unavailable(index.problem or ""))
    data: dict[str, Any] = index.value
    facts = [(k, fmt_value(data[k])) for k in ("dtype", "vocab_size", "eos_id") if k in data]
    if as_number(data.get("unigram_bpb")) is not None:
        facts.append(("unigram baseline bpb", f"{data['unigram_bpb']:.4f}"))
    rows = []
    for split in ("train", "val"):  # the index's other tables (made_from) are not splits
        info = data.get(split)
        if not isinstance(info, dict):
            continue
        tokens, nbytes = as_number(info.get("tokens")), as_number(info.get("bytes"))
        per_token = f"{nbytes / tokens:.3f}" if tokens and nbytes is not None else "—"
        shards = info.get("shards")
        rows.append(
            [
                split,
                fmt_value(info.get("documents", "—")),
                fmt_count(tokens),
                fmt_bytes(nbytes),
                per_token,
                str(len(shards)) if isinstance(shards, list) else "—",
            ]
        )
    headers = ["split", "documents", "tokens", "bytes", "bytes/token", "shards"]
    body = key_value_table(facts) + (grid_table(headers, rows) if rows else "")
    return section("Token shards", body)
