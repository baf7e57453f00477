"""JSON that strict readers accept, with non-finite floats kept legible.

Python's json writes inf and nan as the bare words Infinity and NaN, which are not JSON:
jq, JavaScript's JSON.parse and most other readers reject the whole file. Kiln writes a
non-finite float held in an object as null and names what it was in a sibling key,

    {"perplexity": null, "perplexity_not_finite": "inf"}

and one inside a list held by a key (at any depth of lists) as null, with the sibling
naming each by its place, indices joined by dots:

    {"moe_max_vio": [0.1, null], "moe_max_vio_not_finite": {"1": "nan"}}
    {"moe_load": [[0.5, 0.5], [null, 0.0]], "moe_load_not_finite": {"1.0": "inf"}}

Its readers (`loads`, `restore_non_finite`) turn those back into the floats. A list that
no key holds (a file that is one bare list) has nowhere to name them: its non-finite
floats stay null. Files from older Kiln versions still read: the bare words Infinity and
NaN (Python's parser accepts them), and a list's null alone (which stays null).
"""

from __future__ import annotations

import json
import math
from typing import Any

NOT_FINITE = "_not_finite"  # suffix of the key that says which non-finite value was there
# A dict that already holds both `K` and `K_not_finite` could not be read back as written
# (the reader would take the second for the first's sibling): `finite_form` refuses it.
_WORDS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _word(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def finite_form(value: Any) -> Any:
    """`value` with every non-finite float replaced by null (and, held by a key, named)."""
    if isinstance(value, dict):
        _refuse_sibling_names(value)
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if _non_finite(item):
                out[key] = None
                out[f"{key}{NOT_FINITE}"] = _word(item)
            elif isinstance(item, (list, tuple)):
                words: dict[str, str] = {}
                out[key] = _list_form(item, "", words)
                if words:
                    out[f"{key}{NOT_FINITE}"] = words
            else:
                out[key] = finite_form(item)
        return out
    if isinstance(value, (list, tuple)):
        return _list_form(value, "", {})
    return value


def _refuse_sibling_names(value: dict) -> None:
    for key in value:
        if isinstance(key, str) and key.endswith(NOT_FINITE) and key[: -len(NOT_FINITE)] in value:
            raise ValueError(f"keys {key[: -len(NOT_FINITE)]!r} and {key!r} together cannot be "
                             f"written: {key!r} is the name kiln.strict_json gives the first's "
                             "non-finite value (rename one)")


def _list_form(items: list | tuple, place: str, words: dict[str, str]) -> list:
    """`items` in finite form; each non-finite float's word goes to `words` under its place
    (`place` + its index; a nested list's places continue with a dot)."""
    out = []
    for i, item in enumerate(items):
        if _non_finite(item):
            out.append(None)
            words[f"{place}{i}"] = _word(item)
        elif isinstance(item, (list, tuple)):
            out.append(_list_form(item, f"{place}{i}.", words))
        else:
            out.append(finite_form(item))
    return out


def dumps(value: Any, **kwargs: Any) -> str:
    """json.dumps that never writes Infinity or NaN (see the module docstring)."""
    return json.dumps(finite_form(value), allow_nan=False, **kwargs)


def restore_non_finite(value: Any) -> Any:
    """The inverse of `finite_form`: a null whose sibling names inf, -inf or nan is that float
    again, and the sibling goes. Anything else is left as it is."""
    if isinstance(value, dict):
        out = {key: restore_non_finite(item) for key, item in value.items()}
        for key in [k for k in out if isinstance(k, str) and k.endswith(NOT_FINITE)]:
            base, word = key[: -len(NOT_FINITE)], out[key]
            if base not in out:
                continue
            if out[base] is None and isinstance(word, str) and word in _WORDS:
                out[base] = _WORDS[word]
                del out[key]
            elif isinstance(out[base], list) and _restore_in_list(out[base], word):
                del out[key]
        return out
    if isinstance(value, list):
        return [restore_non_finite(item) for item in value]
    return value


def _restore_in_list(items: list, words: Any) -> bool:
    """Put back the floats `words` names by place in `items` (see `_list_form`); all or
    none: a place that is not a null of `items`, or a word that is not one of ours, leaves
    the list and its sibling as they are. Whether they were put back."""
    if not isinstance(words, dict) or not words:
        return False
    found: list[tuple[list, int, float]] = []
    for place, word in words.items():
        if not (isinstance(word, str) and word in _WORDS):
            return False
        holder, indices = items, place.split(".")
        if not all(i.isascii() and i.isdigit() for i in indices):
            return False
        for i in indices[:-1]:
            holder = holder[int(i)] if int(i) < len(holder) else None
            if not isinstance(holder, list):
                return False
        last = int(indices[-1])
        if last >= len(holder) or holder[last] is not None:
            return False
        found.append((holder, last, _WORDS[word]))
    for holder, i, number in found:
        holder[i] = number
    return True


def loads(text: str | bytes) -> Any:
    """json.loads, with non-finite floats written either way (this module's, or the bare
    words older files hold) read back as floats.

    A text that cannot hold a sibling key (no `_not_finite`, and no \\u escape that could
    spell one) skips the walk over every value, which took 40% of the time to read an MoE
    run's metrics (a 54 x 128 load a line); json reads the bare words itself."""
    value = json.loads(text)
    if isinstance(text, str) and NOT_FINITE not in text and "\\u" not in text:
        return value
    return restore_non_finite(value)
