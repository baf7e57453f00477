"""What a Hugging Face hub cache folder holds besides the data: left out of a source's walk.

A repository in the cache is `<models|datasets|spaces>--<org>--<name>/` with `snapshots/<commit>/`
(the files, as links into `blobs/`), `blobs/` (the files' bytes, named by hash; also
`*.incomplete` downloads and, from older huggingface_hub, `*.lock` files), `refs/<branch>` (a
one-line commit hash) and `.no_exist/` (names known to be missing; hidden, so never walked).
Given as a source, `refs/main` was read as a document (its hash), a partial download as a
text cut anywhere, and a cache root's `version.txt` (the cache layout's version, `1`) as a
one-word document; and the Hugging Face home above the cache (`~/.cache/huggingface`, given
whole) holds the user's access tokens (`token`, `stored_tokens`), read as documents into the
training data; so were they where no hub cache sits beside them (a login alone, the
`datasets` library's cache), or copied into a data folder: a file of those names holding an
access token (`hf_...`) is left out wherever it is. The snapshot links reach every blob of every revision, under the names
that say their format; a blob no snapshot links is no revision's file. Only inside such a
folder: a user's own `refs/` or `blobs/` elsewhere is read as any folder is.
"""

from __future__ import annotations

import os
import re

REPO_FOLDER = re.compile(r"(models|datasets|spaces)--.+")
BOOKKEEPING_DIRS = frozenset({"refs", "blobs"})  # in a repository folder, beside snapshots/
CACHE_VERSION_FILE = "version.txt"  # in a cache root, beside repository folders
TOKEN_FILES = frozenset({"token", "stored_tokens"})  # in the Hugging Face home, beside hub/
# an access token as huggingface_hub writes it: `token` holds it alone, `stored_tokens` (INI)
# one `hf_token = hf_...` line per saved token
ACCESS_TOKEN = re.compile(r"(?:^|\n)(?:hf_token\s*=\s*)?hf_[A-Za-z0-9]{20,}\s*(?:\n|$)")
TOKEN_FILE_MAX_BYTES = 1 << 16  # a token file is small: a larger one is data


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


def is_hf_home(folder: str, subfolders: list[str]) -> bool:
    """The Hugging Face home: a `hub/` holding cache repositories."""
    if "hub" not in subfolders:
        return False
    hub = os.path.join(folder, "hub")
    try:
        return is_cache_root(hub, os.listdir(hub))
    except OSError:
        return False


def files_not_data(folder: str, subfolders: list[str]) -> frozenset[str]:
    """The names of the files in `folder` (holding `subfolders`) that are the cache's or the
    home's own: the layout's version, the access tokens."""
    names = CACHE_VERSION_FILE if is_cache_root(folder, subfolders) else None
    tokens = TOKEN_FILES if is_hf_home(folder, subfolders) else frozenset()
    return tokens | ({names} if names else set())


def holds_access_token(path: str) -> bool:
    """Whether file `path`, named as the home's token files are, holds an access token."""
    if os.path.basename(path) not in TOKEN_FILES:
        return False
    try:
        with open(path, "rb") as f:
            text = f.read(TOKEN_FILE_MAX_BYTES + 1)
    except OSError:
        return False  # the reader counts it as unreadable
    if len(text) > TOKEN_FILE_MAX_BYTES:
        return False
    return ACCESS_TOKEN.search(text.decode("utf-8", "replace")) is not None
