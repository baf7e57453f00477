"""Settings by dotted key, and what differs between two configs: the settings that change
the data a run makes (a trained run refuses to re-make its data under other ones), and
every setting a resume changes."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from kiln.data.prepare_config import KILN_JUDGE, unused_option_tables

if TYPE_CHECKING:
    from kiln.config import Config


def flat_settings(cfg: Config) -> dict[str, Any]:
    """Every setting by dotted key (`prepare.quality.domain`), nested sections included."""
    return flat_table(dataclasses.asdict(cfg))


def flat_table(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict (settings, or a raw TOML table) by dotted key."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out |= flat_table(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out


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
    data setting (what the files hold is compared by the prepare's input fingerprint).
    `kiln:RUN` and `kiln:/abs/RUN` too: config.toml records the judge's run absolute."""
    if isinstance(a, str) and isinstance(b, str) and a.startswith(KILN_JUDGE) and \
            b.startswith(KILN_JUDGE):
        a, b = a[len(KILN_JUDGE):], b[len(KILN_JUDGE):]
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
