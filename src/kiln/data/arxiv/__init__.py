"""arXiv LaTeX sources -> training text, as datatrove pipeline steps.

    ArxivMetadataFilter(snapshot) -> ArxivSourceReader(source_dir) -> LatexToText()

Metadata is filtered before any archive is read; archives are read in memory with safety limits;
LaTeX is converted with includes resolved inside the archive and user macros expanded.

Where this differs from the arXiv-to-model digest (papers/arxiv-latex-pipeline.md), on purpose:
user macros are expanded (the digest's code expands none, so `\\R` stays `\\R`); `\\input` /
`\\include` are followed from the main file (its code concatenates every .tex member in
archive order, so a paper's sections come in that order); paragraph breaks are kept (it
collapses all whitespace); tables and tabulars go with figures; a category matches exactly or as a sub-category (`metadata.category_matches`). Its
`langdetect` "en" rule is the `language` stage (`kiln.data.filters.language`, after `latex`),
judged on the text without math, which the digest notes misleads it. Its >= 50-word rule is Gopher's 50-word minimum there,
and its MD5 dedup of the final text is the `dedup_exact` stage (sha1).
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
