"""JSON with comments (JSONC: tsconfig.json, .eslintrc.json, VS Code's settings): the JSON it
stands for, so a `.json` file with comments is read as the same file without them would be.

JSONC allows `//` and `/* */` comments and a trailing comma before `]` or `}`; both are
removed outside strings, by regular expressions (linear, in C: a damaged multi-gigabyte
dataset is never walked character by character in Python).
"""

from __future__ import annotations

import json
import re

from kiln.data.json_depth import MAX_JSON_DEPTH, NestedTooDeep, deeper_than

# a string to its end, or to the end of the text if unterminated; possessive (Python 3.11):
# the regex engine keeps no backtracking state per character, which made long strings slow
_STRING = r'"(?:[^"\\]++|\\.)*+"?'
# an unclosed `/*` runs to the end (the text then fails to parse): each match consumes what
# it scans, so no input makes the scan quadratic
_COMMENTS = re.compile(_STRING + r"|//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_TRAILING_COMMAS = re.compile(_STRING + r"|,(?=\s*[\]}])")


def _drop(m: re.Match) -> str:
    token = m.group()
    return token if token.startswith('"') else " " if token.startswith("/*") else ""


def strip_jsonc(text: str) -> str:
    """`text` without its comments and trailing commas (strings are left as they are)."""
    return _TRAILING_COMMAS.sub(_drop, _COMMENTS.sub(_drop, text))


def may_be_jsonc(error: json.JSONDecodeError) -> bool:
    """Whether JSON that failed with `error` broke where JSONC differs from JSON: at a `/`
    (a comment) or at a `]` / `}` after a comma. A cut-off or otherwise damaged file is
    not stripped and parsed again for nothing."""
    at = error.doc[error.pos:error.pos + 1]
    return at == "/" or (at in ("]", "}") and error.doc[:error.pos].rstrip().endswith(","))


def jsonc_value(error: Exception) -> tuple[object] | None:
    """(value,) of the text whose JSON parse failed with `error`, read as JSONC; None where
    it is not JSONC either (not UTF-8, cut off, broken elsewhere). NestedTooDeep where it is
    JSONC nested past MAX_JSON_DEPTH (`kiln.data.json_depth`)."""
    if not isinstance(error, json.JSONDecodeError) or not may_be_jsonc(error):
        return None
    text = strip_jsonc(error.doc)
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestedTooDeep from None
    except ValueError:
        return None
    if deeper_than(text, MAX_JSON_DEPTH):  # the one limit, as for the file without comments
        raise NestedTooDeep
    return (value,)
