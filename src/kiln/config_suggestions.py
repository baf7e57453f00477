"""The closest valid name for a mistyped config key or choice, for ConfigError messages:
a typo names its fix (`train.lr` -> `optim.lr`, `[trian]` -> `train`) instead of only being
refused."""

from __future__ import annotations

import dataclasses
import difflib
import typing

from kiln.config_aliases import alias_hint
from kiln.config_changes import flat_settings


def suggest(key: str, valid: typing.Iterable[str]) -> str:
    valid = list(valid)
    same_letters = [v for v in valid if isinstance(key, str) and v.lower() == key.lower()]
    close = same_letters or difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def suggest_key(full: str, root: type) -> str:
    """For an unknown dotted key of the config tree `root` (kiln.config.Config): the same
    name in other sections (`train.lr` -> `optim.lr`), then the closest name in its own
    section, then the closest anywhere."""
    section, _, name = full.rpartition(".")
    leaves = list(flat_settings(root()))
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
        return suggest(name, [f.name for f in dataclasses.fields(root)])
    tables = [".".join(k.split(".")[:i]) for k in leaves for i in range(2, k.count(".") + 1)]
    keys = list(dict.fromkeys(leaves + tables))  # `prepare.quality` is a key too
    by_name = [k for k in keys if k.rpartition(".")[2] == name and k != full]
    own = [k for k in keys if k.rpartition(".")[0] == section]
    near = [f"{section}.{c}" for c in difflib.get_close_matches(
        name, [k.rpartition(".")[2] for k in own], n=1)]
    anywhere = difflib.get_close_matches(name, [k.rpartition(".")[2] for k in keys], n=1)
    if anywhere and near and _likeness(name, anywhere[0]) <= _likeness(name, near[0]):
        anywhere = []  # `train.stpes`: `train.steps`, not also a tie in another section
    near += [k for k in keys if anywhere and k.rpartition(".")[2] == anywhere[0]][:1]
    picks = list(dict.fromkeys(by_name + near))[:2]
    return f" (did you mean {' or '.join(repr(p) for p in picks)}?)" if picks else ""


def _likeness(name: str, key: str) -> float:
    """difflib's similarity of `name` to `key`'s last part, the measure its close matches rank by."""
    return difflib.SequenceMatcher(None, name, key.rpartition(".")[2]).ratio()
