"""arXiv LaTeX sources -> training text, as datatrove pipeline steps.

    ArxivMetadataFilter(snapshot) -> ArxivSourceReader(source_dir) -> LatexToText()

Metadata is filtered before any archive is read; archives are read in memory with safety limits;
LaTeX is converted with includes resolved inside the archive and user macros expanded.
"""

from kiln.data.arxiv.archives import (
    ArchiveContents,
    ArchiveLimits,
    ArchiveRefused,
    read_source_archive,
)
from kiln.data.arxiv.ids import archive_stem, find_source_archive
from kiln.data.arxiv.latex import ExtractResult, LatexToText, latex_to_text
from kiln.data.arxiv.markup_metrics import count_math_spans, leaked_markup
from kiln.data.arxiv.metadata import DEFAULT_CATEGORIES, ArxivMetadataFilter, metadata_drop_reason
from kiln.data.arxiv.source_reader import ArxivSourceReader

__all__ = [
    "DEFAULT_CATEGORIES", "ArchiveContents", "ArchiveLimits", "ArchiveRefused",
    "ArxivMetadataFilter", "ArxivSourceReader", "ExtractResult", "LatexToText",
    "archive_stem", "count_math_spans", "find_source_archive", "latex_to_text",
    "leaked_markup", "metadata_drop_reason", "read_source_archive",
]
