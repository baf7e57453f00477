"""arXiv identifiers -> source-archive file names in a local folder.

Mapping (the layout of arXiv's bulk source dumps, flattened or not):

- new-style ``2101.00001`` (optionally ``v2``): stem ``2101.00001``
- old-style ``hep-th/9901001``: stem ``hep-th9901001`` (the slash is dropped, as arXiv does;
  `id_from_stem` puts it back)

The archive is looked up as ``<folder>/<yymm>/<stem><ext>`` (arXiv's S3 bulk layout), then
``<folder>/<stem><ext>``, then, for an old-style id only, ``<folder>/<archive>/<number><ext>``
(the e-print URLs' layout, ``hep-th/9901001.gz``; ``math.CO/0501001`` is in ``math/``), for ext
in ``""``, ``.tar``, ``.tar.gz``, ``.tgz``, ``.gz``, ``.tex`` (first hit wins); ``yymm`` is the first
four digits of the number (``2101``, ``9901``). The version suffix is ignored. `id_from_path`
names a file the same way back.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePath

from kiln.data.dating import ARXIV_OLD_ARCHIVES

NEW_STYLE = re.compile(r"^(\d{4})\.(\d{4,5})(v\d+)?$")
OLD_STYLE = re.compile(r"^([a-z][a-z\-]*(?:\.[A-Z]{2})?)/(\d{7})(v\d+)?$")
OLD_STYLE_STEM = re.compile(rf"^({'|'.join(map(re.escape, ARXIV_OLD_ARCHIVES))})(\d{{7}}(?:v\d+)?)$")
OLD_STYLE_NUMBER = re.compile(r"^\d{7}(?:v\d+)?$")  # a file stem that is an old-style id's number alone
ARCHIVE_EXTENSIONS = ("", ".tar", ".tar.gz", ".tgz", ".gz", ".tex")


def archive_stem(arxiv_id: str) -> tuple[str, str]:
    """(yymm, file stem) for an id; ValueError names the id if it is neither style."""
    arxiv_id = arxiv_id.strip()
    if m := NEW_STYLE.match(arxiv_id):
        return m.group(1), f"{m.group(1)}.{m.group(2)}"
    if m := OLD_STYLE.match(arxiv_id):
        return m.group(2)[:4], f"{m.group(1).split('.')[0]}{m.group(2)}"
    raise ValueError(f"not an arXiv id: {arxiv_id!r}")


def id_from_stem(stem: str) -> str:
    """The arXiv id a file stem names: ``hep-th9901001`` -> ``hep-th/9901001`` (one of arXiv's
    old archive names only); other stems as is.

    The stem loses an old-style id's subject class (``math.CO/0501001`` is stored as
    ``math0501001``); the canonical id has none either (``math/0501001``).
    """
    m = OLD_STYLE_STEM.match(stem)
    return f"{m.group(1)}/{m.group(2)}" if m else stem


def id_from_path(path: PurePath) -> str:
    """The arXiv id a source file names: its stem without archive extensions (`id_from_stem`);
    a stem that is an old-style number alone (``hep-th/9901001.gz``) takes its archive from the
    parent folder when that is one of arXiv's old archive names, else stays as is."""
    stem = path.name.split(".tar")[0].removesuffix(".tgz").removesuffix(".gz").removesuffix(".tex")
    if OLD_STYLE_NUMBER.match(stem) and path.parent.name in ARXIV_OLD_ARCHIVES:
        return f"{path.parent.name}/{stem}"
    return id_from_stem(stem)


def find_source_archive(folder: Path | str, arxiv_id: str) -> Path | None:
    """The local source archive for `arxiv_id`, or None when no candidate file exists."""
    yymm, stem = archive_stem(arxiv_id)
    folder = Path(folder)
    bases = [(folder / yymm, stem), (folder, stem)]
    if (m := OLD_STYLE.match(arxiv_id.strip())) and (archive := m.group(1).split(".")[0]) in ARXIV_OLD_ARCHIVES:
        bases.append((folder / archive, m.group(2)))
    for base, name in bases:
        for ext in ARCHIVE_EXTENSIONS:
            path = base / f"{name}{ext}"
            if path.is_file():
                return path
    return None


def id_year(arxiv_id: str) -> int | None:
    """Submission year encoded in the id (yymm), used when the metadata has no dates."""
    try:
        yymm, _ = archive_stem(arxiv_id)
    except ValueError:
        return None
    yy = int(yymm[:2])
    return 1900 + yy if yy >= 91 else 2000 + yy
