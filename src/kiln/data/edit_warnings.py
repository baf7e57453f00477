"""Warn when a prepare stage kept documents but deleted most of their text.

The drop counts and the kept fraction only see documents removed whole. C4's line rules
(the `prose` quality domain) instead delete lines that hold under 3 words, mention
javascript or cookie/terms-of-use phrases, or hold a > 1000-character word: on a page of
mostly such lines (an article about JavaScript, a list of two-word lines) the document that
survives is a fragment. (C4's terminal-punctuation rule, which cut hard-wrapped text to
fragments, is off, as in FineWeb: `kiln.data.filters.quality`.)
"""

from __future__ import annotations

from pathlib import Path

from kiln import strict_json

# kept documents that lost more than this share of their bytes to a filter's edits
MOST_REMOVED = 0.5


def yield_stages(run_dir: Path) -> list:
    """The stage rows of the run's `yield.json`; [] where it is missing or unreadable (the
    warnings read from it are advice, never a reason to fail a finished prepare)."""
    try:
        stages = strict_json.loads((Path(run_dir) / "yield.json").read_text(encoding="utf-8"))["stages"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return stages if isinstance(stages, list) else []


def edit_warnings(run_dir: Path) -> list[str]:
    """One line per stage of `yield.json` whose edits removed most of the kept text."""
    out = []
    for row in yield_stages(run_dir):
        edited = row.get("edited") if isinstance(row, dict) else None
        if not isinstance(edited, dict) or not edited.get("bytes_in"):
            continue
        before, after = edited["bytes_in"], edited.get("bytes_out", 0)
        if before - after > MOST_REMOVED * before:
            out.append(
                f"{row['stage']}: C4's line rules (prepare.quality.domain = \"prose\") removed "
                f"{(before - after) / before:.0%} of the text of the documents they kept "
                f"({before:,} -> {after:,} bytes): they delete each line that has under 3 "
                "words, mentions javascript or a cookie/terms-of-use phrase, or holds a word "
                "over 1000 characters; leave \"quality\" out of prepare.stages, or choose "
                "another prepare.quality.domain, to keep such text whole; see "
                f"{Path(run_dir) / 'yield.json'}")
    return out
