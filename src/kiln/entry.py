"""The `kiln` command's entry point: the installed libraries are checked against Kiln's
declared versions before Kiln's modules import them (an import that an older library
cannot satisfy would otherwise end in a traceback before any check could run)."""

from __future__ import annotations

import os
import sys

from kiln.dependency_versions import refusal, unmet_requirements


def main(argv: list[str] | None = None) -> int:
    unmet = unmet_requirements()
    if unmet:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # under torchrun: said once per node
            print(f"kiln: {refusal(unmet)}", file=sys.stderr)
        return 2
    from kiln.cli import main as run_verb

    return run_verb(argv)
