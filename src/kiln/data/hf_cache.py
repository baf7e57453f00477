"""What a Hugging Face hub cache folder holds besides the data: left out of a source's walk.

A repository in the cache is `<models|datasets|spaces>--<org>--<name>/` with `snapshots/<commit>/`
(the files, as links into `blobs/`), `blobs/` (the files' bytes, named by hash; also
`*.incomplete` downloads and, from older huggingface_hub, `*.lock` files), `refs/<branch>` (a
one-line commit hash) and `.no_exist/` (names known to be missing; hidden, so never walked).
Given as a source, `refs/main` was read as a document (its hash), a partial download as a
text cut anywhere, and a cache root's `version.txt` (the cache layout's version, `1`) as a
one-word document. The snapshot links reach every blob of every revision, under the names
that say their format; a blob no snapshot links is no revision's file. Only inside such a
folder: a user's own `refs/` or `blobs/` elsewhere is read as any folder is.
"""

from __future__ import annotations

import os
import re

REPO_FOLDER = re.compile(r"(models|datasets|spaces)--.+")
BOOKKEEPING_DIRS = frozenset({"refs", "blobs"})  # in a repository folder, beside snapshots/
CACHE_VERSION_FILE = "version.txt"  # in a cache root, beside repository folders


def is_repo_folder(name: str, subfolders: list[str]) -> bool:
    """A cache repository: its name, and a `snapshots/` in it."""
    return REPO_FOLDER.fullmatch(name) is not None and "snapshots" in subfolders


def bookkeeping_dirs(name: str, subfolders: list[str]) -> set[str]:
    """The subfolders of folder `name` (holding `subfolders`) not to walk."""
    return BOOKKEEPING_DIRS & set(subfolders) if is_repo_folder(name, subfolders) else set()


def is_cache_root(folder: str, subfolders: list[str]) -> bool:
    """A folder holding cache repositories (the hub cache itself)."""
    return any(REPO_FOLDER.fullmatch(d) and os.path.isdir(os.path.join(folder, d, "snapshots"))
               for d in subfolders)
