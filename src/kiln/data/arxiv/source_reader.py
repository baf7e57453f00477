"""Pipeline step: arXiv ids (from `ArxivMetadataFilter`) or a folder of archives -> LaTeX sources.

Each yielded Document carries ``metadata["latex_files"]`` (path -> text, in memory) for
`LatexToText`. Refused archives and members are counted by reason; one broken archive never stops
the rest. Stat keys: ``archives/ok``, ``invalid/<reason>``, ``empty_tex/<reason>``,
``refused_member/<reason>``, ``missing_source``, and per file ``cp1252_fallback`` (a legacy 8-bit
file) and ``utf8_repaired`` (UTF-8 with a few invalid bytes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.data.arxiv.archives import (
    TEX_SUFFIXES,
    ArchiveContents,
    ArchiveLimits,
    ArchiveRefused,
    read_source_archive,
)
from kiln.data.arxiv.ids import find_source_archive, id_from_path
from kiln.data.sources import printable_name

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# which archives are read and how (limits, encodings)
RULES_VERSION = "2026-12-07"


class ArxivSourceReader(PipelineStep):
    """Look up and safely read each paper's source archive from a local folder.

    With input Documents (ids), each is looked up via `find_source_archive`. Without input, every
    file under `source_dir` is read (sorted; file i goes to rank i % world_size), id = file stem,
    with the slash of an old-style id put back (``hep-th9901001.gz`` -> ``hep-th/9901001``, and
    ``hep-th/9901001.gz`` -> ``hep-th/9901001``: see `id_from_path`).
    """

    type = "📖 - READER"
    name = "🔥 arXiv sources"

    def __init__(self, source_dir: str, limits: ArchiveLimits | None = None):
        super().__init__()
        if not Path(source_dir).is_dir():
            raise FileNotFoundError(f"arXiv source folder not found: {source_dir!r}")
        self.source_dir = str(source_dir)
        self.limits = limits or ArchiveLimits()

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        if data is not None:
            for doc in data:
                try:
                    path = find_source_archive(self.source_dir, doc.metadata.get("arxiv_id", doc.id))
                except ValueError:
                    self.stat_update("invalid/bad_id")
                    continue
                if path is None:
                    self.stat_update("missing_source")
                    continue
                yield from self._read(path, doc)
            return
        files = sorted(p for p in Path(self.source_dir).rglob("*") if p.is_file())
        for path in files[rank::world_size]:
            arxiv_id = printable_name(id_from_path(path))  # JSON-writable: `\xNN` for bytes
            doc = Document(text="", id=arxiv_id, metadata={"arxiv_id": arxiv_id})
            yield from self._read(path, doc)

    def _read(self, path: Path, doc: Document) -> Iterator[Document]:
        self.stat_update("archives/read")
        try:
            raw = self._read_bytes(path)
            contents = read_source_archive(raw, printable_name(path.name), self.limits)
        except ArchiveRefused as exc:
            self.stat_update(f"invalid/{exc.reason}")
            return
        except OSError:
            self.stat_update("invalid/unreadable")
            return
        for reason, n in contents.refused.items():
            self.stat_update(f"refused_member/{reason}", value=n)
        if contents.non_utf8:
            self.stat_update("cp1252_fallback", value=contents.non_utf8)
        if contents.repaired_utf8:
            self.stat_update("utf8_repaired", value=contents.repaired_utf8)
        if not any(name.lower().endswith(TEX_SUFFIXES) for name in contents.files):
            self.stat_update(f"empty_tex/{_no_tex_reason(contents)}")
            return
        self.stat_update("archives/ok")
        doc.metadata.update(source=printable_name(str(path)), archive_kind=contents.kind, latex_files=contents.files)
        yield doc

    def _read_bytes(self, path: Path) -> bytes:
        """The file, refused by its size on disk before it is read (and never past the limit)."""
        limit = self.limits.max_total_bytes
        if (size := path.stat().st_size) > limit:
            raise ArchiveRefused("too_large", f"{size} bytes on disk")
        with path.open("rb") as f:
            return f.read(limit + 1)  # a file that grew since is refused by read_source_archive


def _no_tex_reason(contents: ArchiveContents) -> str:
    if not contents.kind.startswith("tar"):
        return "not_latex"
    return "no_tex_file" if contents.members else "empty_archive"
