"""Writing a config: the resolved config as TOML (a run's config.toml, which `load_config`
reads back to the same config), and a path as a `--set` value, quoted so that any name
survives the round trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.config import Config


# config_to_toml's first line: a file that starts so lists every setting, not those a user gave
RECORD_HEADER = "# Kiln's resolved config: every setting, defaults included"


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes for quotes, backslashes and control characters,
    but not its surrogate pairs (`\\ud83d\\udd25` for an emoji, which TOML refuses), so
    characters outside ASCII stay as they are; DEL, which JSON leaves bare, is escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


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
