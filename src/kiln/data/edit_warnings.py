"""Warn when a prepare stage kept documents but deleted most of their text.

The drop counts and the kept fraction only see documents removed whole. C4's line rules
(the `prose` quality domain) instead delete lines that do not end in terminal punctuation
or hold under 3 words: on hard-wrapped text (books, licenses, RFCs, mail: one paragraph over
many short lines) that is most of every line, and the documents that survive are fragments.
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
                f"({before:,} -> {after:,} bytes): they delete each line that does not end in "
                ". ! ? or \" or has under 3 words, which leaves hard-wrapped text (a paragraph "
                "over many lines) in fragments; join each paragraph onto one line before "
                "prepare, or leave \"quality\" out of prepare.stages; see "
                f"{Path(run_dir) / 'yield.json'}")
    return out
