"""JSON that strict readers accept, with non-finite floats kept legible.

Python's json writes inf and nan as the bare words Infinity and NaN, which are not JSON:
jq, JavaScript's JSON.parse and most other readers reject the whole file. Kiln writes a
non-finite float held in an object as null and names what it was in a sibling key,

    {"perplexity": null, "perplexity_not_finite": "inf"}

(one inside a list is null alone), and its readers (`loads`, `restore_non_finite`) turn
that back into the float. Files from older Kiln versions, with the bare words, still read:
Python's parser accepts them.
"""

from __future__ import annotations

import json
import math
from typing import Any

NOT_FINITE = "_not_finite"  # suffix of the key that says which non-finite value was there
_WORDS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _word(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def finite_form(value: Any) -> Any:
    """`value` with every non-finite float replaced by null (and, in an object, named)."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if _non_finite(item):
                out[key] = None
                out[f"{key}{NOT_FINITE}"] = _word(item)
            else:
                out[key] = finite_form(item)
        return out
    if isinstance(value, (list, tuple)):
        return [None if _non_finite(item) else finite_form(item) for item in value]
    return value


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
            if base in out and out[base] is None and word in _WORDS:
                out[base] = _WORDS[word]
                del out[key]
        return out
    if isinstance(value, list):
        return [restore_non_finite(item) for item in value]
    return value


def loads(text: str | bytes) -> Any:
    """json.loads, with non-finite floats written either way (this module's, or the bare
    words older files hold) read back as floats."""
    return restore_non_finite(json.loads(text))
