"""The `[prepare]` options that name files or folders, recorded as absolute paths.

A recipe's `benchmarks = ["bench.jsonl"]` names a file in the folder `kiln` ran from;
recorded as written, `kiln prepare RUN` from another folder failed ("file not found"), or
read another folder's file of that name. config.toml and the prepare's signature record
them absolute, as `data.sources` (`kiln.run_dir.write_run_metadata`); a signature recorded
relative by an older Kiln is compared by the path it names from here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from kiln.config import PATH_KEYS
from kiln.data.prepare_config import KILN_JUDGE, PrepareConfig

# (option table, key): a path, a list of paths, or ("judge") "kiln:RUN_DIR"
PATH_OPTIONS = (*(tuple(k.split(".")[1:]) for k in PATH_KEYS if k.startswith("prepare.")),
                ("brain_rot_m2", "judge"))


def _mapped(key: str, value: object, how: Callable[[str], str]) -> object:
    if isinstance(value, list):
        return [_mapped(key, v, how) for v in value]
    if not isinstance(value, str) or not value:
        return value
    if key == "judge":
        return (KILN_JUDGE + how(value[len(KILN_JUDGE):]) if value.startswith(KILN_JUDGE)
                else value)
    return how(value)


def anchored(cfg: PrepareConfig) -> PrepareConfig:
    """`cfg` with every path option absolute (from the current folder)."""
    tables: dict[str, object] = {}
    for table, key in PATH_OPTIONS:
        options = tables.get(table, getattr(cfg, table))
        tables[table] = dataclasses.replace(
            options, **{key: _mapped(key, getattr(options, key), os.path.abspath)})
    return dataclasses.replace(cfg, **tables)


def real_paths(settings: dict) -> dict:
    """A copy of `settings` (a signature, or `dataclasses.asdict` of a PrepareConfig) with its
    path options as the real paths they name from here: `d`, `./d`, its absolute path and a
    link to it are one setting."""
    out = dict(settings)
    for table, key in PATH_OPTIONS:
        options = out.get(table)
        if isinstance(options, dict) and key in options:
            out[table] = {**options, key: _mapped(key, options[key], os.path.realpath)}
    return out
