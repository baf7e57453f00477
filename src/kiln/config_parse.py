"""Reading a config: a raw TOML table (a recipe, with `--set a.b=c` overrides merged in)
into the typed dataclass tree, each value checked against its type hint. A value TOML read
otherwise than meant (`.5`, `True`, a bare date) is refused with its TOML spelling."""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib
import types
import typing
from typing import Any

from kiln.config_suggestions import suggest_key
from kiln.errors import ConfigError


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
            # quoted as a shell reads it pasted: an item with an apostrophe ended the quote
            # ('it's'), and an accented one was shown as \u00e9
            example = shlex.quote(f"{key}={json.dumps(items, ensure_ascii=False)}" if items
                                  else f"{key}=[...]")
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r} "
                              f"(on the command line: --set {example})")
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


# what other configs and shells spell a boolean (`yes`, `1`, `on`), as TOML spells it
_BOOLEAN_WORDS = {**dict.fromkeys(("true", "yes", "y", "on", "1"), "true"),
                  **dict.fromkeys(("false", "no", "n", "off", "0"), "false")}


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
    if hint is int and isinstance(value, float) and value.is_integer():  # 1e3, 3.0
        if abs(value) >= 2**63:  # 1e22: the integer named would be refused next
            return " (an integer in TOML has no point or exponent, and is at most 2**63 - 1)"
        return f" (an integer in TOML has no point or exponent: {key}={int(value)})"
    if hint is bool and not isinstance(value, bool):  # yes / 1 / on: the boolean meant
        meant = _BOOLEAN_WORDS.get(str(value).strip().lower())
        if meant is not None and str(value).lower() == meant:  # True: the case alone
            return f" (TOML booleans are lowercase: {meant})"
        if meant is not None:
            return f" (a TOML boolean is true or false: {key}={meant})"
    if not isinstance(value, str):
        return ""
    if hint in (int, float):
        try:
            number = float(value)
        except ValueError:
            return ""
        if hint is int and number.is_integer():
            return f" (as a TOML number: {int(number)})"
        return f" (as a TOML number: {number!r})"
    return ""


def build_config(cls: type, data: dict[str, Any], prefix: str = "",
                 root: type | None = None) -> Any:
    """The dataclass `cls` from a raw TOML table. `root`: the whole tree's class (`cls`
    at the top), among whose keys an unknown key's closest is looked for."""
    root = root or cls
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'{suggest_key(full, root)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a [{full}] table, got {value!r}")
            kwargs[key] = build_config(hint, value, f"{full}.", root)
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
    except tomllib.TOMLDecodeError as e:
        value = raw.strip()  # a bare word is a string: --set train.precision=bf16
        if value[:1] in ("\"", "'"):  # quoted, but not as TOML: `"runs/x` was a folder
            # named with the quote, made silently where the user meant runs/x
            reason = str(e).split(" (at ")[0]
            raise ConfigError(f"override '{text}': {key.strip()} is not valid TOML text "
                              f"({reason}): quote the whole value once, e.g. --set "
                              f"'{key.strip()}=\"...\"'") from e
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
