"""`python -m kiln VERB ...` runs the `kiln` command (handy where the venv's scripts are not
on PATH, and under `torchrun -m kiln`)."""

import sys

from kiln.entry import main

if __name__ == "__main__":
    sys.exit(main())
