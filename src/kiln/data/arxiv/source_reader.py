"""Pipeline step: arXiv ids (from `ArxivMetadataFilter`) or a folder of archives -> LaTeX sources.

Each yielded Document carries ``metadata["latex_files"]`` (path -> text, in memory) for
`LatexToText`. Refused archives and members are counted by reason; one broken archive never stops
the rest. Stat keys: ``archives/ok``, ``invalid/<reason>``, ``empty_tex/<reason>``,
``refused_member/<reason>``, ``missing_source``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.data.arxiv.archives import (
    TEX_SUFFIXES,
    ArchiveLimits,
    ArchiveRefused,
    read_source_archive,
)
from kiln.data.arxiv.ids import find_source_archive


class ArxivSourceReader(PipelineStep):
    """Look up and safely read each paper's source archive from a local folder.

    With input Documents (ids), each is looked up via `find_source_archive`. Without input, every
    file under `source_dir` is read (sorted; file i goes to rank i % world_size), id = file stem.
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
            stem = path.name.split(".tar")[0].removesuffix(".tgz").removesuffix(".gz")
            stem = stem.removesuffix(".tex")
            doc = Document(text="", id=stem, metadata={"arxiv_id": stem})
            yield from self._read(path, doc)

    def _read(self, path: Path, doc: Document) -> Iterator[Document]:
        self.stat_update("archives/read")
        try:
            raw = path.read_bytes()
            contents = read_source_archive(raw, path.name, self.limits)
        except ArchiveRefused as exc:
            self.stat_update(f"invalid/{exc.reason}")
            return
        except OSError:
            self.stat_update("invalid/unreadable")
            return
        for reason, n in contents.refused.items():
            self.stat_update(f"refused_member/{reason}", value=n)
        if contents.non_utf8:
            self.stat_update("latin1_fallback", value=contents.non_utf8)
        if not any(name.lower().endswith(TEX_SUFFIXES) for name in contents.files):
            self.stat_update("empty_tex/no_tex_file" if contents.kind.startswith("tar") else "empty_tex/not_latex")
            return
        self.stat_update("archives/ok")
        doc.metadata.update(source=str(path), archive_kind=contents.kind, latex_files=contents.files)
        yield doc
