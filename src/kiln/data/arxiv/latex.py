"""LaTeX sources of one paper -> "Title: …\\nAbstract: …\\nBody: …" text.

Order: choose the main file, resolve \\input/\\include/\\subfile inside the archive (comments
stripped per file), drop \\iffalse blocks (`latex_conditionals`), split preamble/body, collect
macro definitions (local .sty files named by \\usepackage, next to the main file or else at the
root; then preamble, later wins; then the body's, each where TeX scopes it: `latex_scopes`) and
remove them, expand macros, pull title and abstract, convert the body (`latex_convert`).
Declarations in local .sty files and the preamble (\\MakeShortVerb{\\|}, \\lstnewenvironment,
\\excludecomment...) hold in the body. A \\title or abstract inside a literal span (shown in a
verbatim) is not the paper's. Title/abstract from arXiv metadata win over the source's.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from dataclasses import dataclass, field

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from kiln.data.arxiv.latex_conditionals import NEWIF, drop_false_branches
from kiln.data.arxiv.latex_convert import LatexConverter
from kiln.data.arxiv.latex_literal import NO_DECLARATIONS, Declared, LiteralSpans
from kiln.data.arxiv.latex_macros import collect_definitions, expand_macros
from kiln.data.arxiv.latex_scopes import expand_scoped
from kiln.data.arxiv.latex_source import (
    LatexRefused,
    cut_at_endinput,
    find_main_file,
    normalise_include,
    read_bracket,
    read_group,
    resolve_includes,
    skip_blanks,
    split_document,
    strip_comments,
)

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# the LaTeX-to-text conversion (kiln.data.arxiv.latex_*)
RULES_VERSION = "2026-12-08.2"

USEPACKAGE = re.compile(r"\\usepackage\s*(?:\[[^\]]*\])?\s*\{([^}]*)\}")
TITLE = re.compile(r"\\(?:icml)?title(?![a-zA-Z@])\s*")  # ICML's is \icmltitle, in the body
ABSTRACT_BEGIN = re.compile(r"\\begin\s*\{abstract\}")
ABSTRACT_END = re.compile(r"\\end\s*\{abstract\}")
ABSTRACT_MACRO = re.compile(r"\\abstract(?![a-zA-Z@])\s*(?=\{)")


@dataclass
class ExtractResult:
    """Extraction of one paper; `main` is None when no main file was found."""

    main: str | None
    title: str = ""
    abstract: str = ""
    body: str = ""
    counts: Counter = field(default_factory=Counter)

    def text(self, title: str | None = None, abstract: str | None = None) -> str:
        """The training text; `title`/`abstract` (e.g. from arXiv metadata) override the source's."""
        return f"Title: {title or self.title}\nAbstract: {abstract or self.abstract}\nBody: {self.body}"


def _convert(fragment: str, theorems: dict[str, str], counts: Counter, declared: Declared) -> str:
    return LatexConverter(fragment, theorems, counts, declared).text()


def _title_source(spans: LiteralSpans) -> str | None:
    """The argument of the first \\title in the text of `spans` outside them."""
    text = spans.text
    m = spans.search(TITLE)
    if not m:
        return None
    pos = m.end()
    if text[pos : pos + 1] == "[":
        pos = skip_blanks(text, (read_bracket(text, pos, spans) or ("", pos + 1))[1])
    group = read_group(text, pos, spans) if text[pos : pos + 1] == "{" else None
    return group[0] if group else None


def _abstract_source(spans: LiteralSpans) -> str | None:
    """The first abstract environment (else \\abstract{..}) in the text of `spans` outside them."""
    text = spans.text
    if (begin := spans.search(ABSTRACT_BEGIN)) and (end := spans.search(ABSTRACT_END, begin.end())):
        return text[begin.end() : end.start()]
    if m := spans.search(ABSTRACT_MACRO):
        group = read_group(text, m.end(), spans)
        return group[0] if group else None
    return None


def _local_package(files: dict[str, str], main: str, package: str) -> str | None:
    """The archive's `package`.sty as TeX finds it: next to the main file, else at the root."""
    for base_dir in dict.fromkeys((posixpath.dirname(main), "")):
        path = normalise_include(base_dir, f"{package.strip()}.sty")
        if path is not None and path in files:
            return path
    return None


def _package_conditionals(files: dict[str, str]) -> frozenset[str]:
    """The \\newif conditionals the archive's local packages and classes declare: an
    \\ifdraft ... \\fi nested in an \\iffalse block must close its own \\fi, not the block's."""
    return frozenset(
        name for path, text in files.items()
        if path.endswith((".sty", ".cls")) and "\\newif" in text for name in NEWIF.findall(text)
    )


def latex_to_text(files: dict[str, str], main: str | None = None) -> ExtractResult:
    """Extract one paper from its sources (archive path -> text); nothing outside `files` is read.

    Raises `LatexRefused` for a document that cannot be extracted within budget.
    """
    main = main or find_main_file(files)
    if main is None or main not in files:
        return ExtractResult(main=None)
    counts: Counter = Counter()
    conditionals = _package_conditionals(files)
    packages = "\n".join(text for path, text in files.items() if path.endswith((".sty", ".cls")))
    text = resolve_includes(files, main, counts)
    preamble, body = split_document(drop_false_branches(text, counts, conditionals=conditionals, packages=packages))
    macro_sources = []
    for m in USEPACKAGE.finditer(preamble):
        for package in m.group(1).split(","):
            if (sty := _local_package(files, main, package)) is not None:
                macro_sources.append(cut_at_endinput(strip_comments(files[sty])))
    declared = NO_DECLARATIONS  # \MakeShortVerb{\|}, \lstnewenvironment...: they hold after them
    package_spans = []  # each package's literal spans, read once, with the declarations before it
    for source in macro_sources:
        package_spans.append(LiteralSpans(source, declared))
        declared = package_spans[-1].declared_after
    if declared != NO_DECLARATIONS:  # a local package's verbatim-like environments: % in them is code
        counts = Counter()
        text = resolve_includes(files, main, counts, declared=declared)
        preamble, body = split_document(drop_false_branches(text, counts, declared, conditionals, packages), declared)
    macros: dict = {}
    theorems: dict[str, str] = {}
    preamble_spans = LiteralSpans(preamble, declared)  # for its definitions, declarations and title
    for spans in (*package_spans, preamble_spans):
        _, found, named = collect_definitions(spans.text, counts, spans=spans, known=macros)
        macros.update(found)
        theorems.update(named)
    declared = preamble_spans.declared_after
    before, definitions = dict(macros), []
    body, found, named = collect_definitions(body, counts, declared, known=macros, definitions=definitions)
    macros.update(found)
    theorems.update(named)
    body = expand_scoped(body, before, definitions, counts, declared)  # each where TeX says it holds
    result = ExtractResult(main=main, counts=counts)
    converter = LatexConverter(body, theorems, counts, declared)  # its literal spans serve twice
    title = _title_source(converter.spans)
    abstract = _abstract_source(converter.spans)
    if not title or not abstract:
        title = title or _title_source(preamble_spans)
        abstract = abstract or _abstract_source(preamble_spans)
    if title is not None:
        result.title = _convert(expand_macros(title, macros, counts, declared), theorems, Counter(), declared)
    if abstract is not None:
        result.abstract = _convert(expand_macros(abstract, macros, counts, declared), theorems, Counter(), declared)
    result.body = converter.text()
    return result


class LatexToText(PipelineStep):
    """Documents with ``metadata["latex_files"]`` -> the training text in `doc.text`.

    Stats: ``converted``, ``empty_tex/no_main``, ``empty_tex/no_text`` (empty body),
    ``refused/<reason>`` (`LatexRefused`: e.g. ``include_budget``, an \\input fan-out),
    ``error/<exception>`` (document dropped, run continues; MemoryError included, as a last
    line of defence behind the budgets) and the extraction counters
    (``includes_refused``, ``macros_expanded``...). Papers with empty body are dropped.
    """

    type = "✂️ - EXTRAC"
    name = "🔥 LaTeX to text"

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        for doc in data or ():
            files = doc.metadata.pop("latex_files", None)
            if not files:
                self.stat_update("empty_tex/no_files")
                continue
            try:
                result = latex_to_text(files)
            except LatexRefused as exc:
                self.stat_update(f"refused/{exc.reason}")
                continue
            except (RecursionError, ValueError, IndexError, KeyError, TypeError, MemoryError) as exc:
                self.stat_update(f"error/{type(exc).__name__}")
                continue
            for key, n in result.counts.items():
                self.stat_update(key, value=n)
            if result.main is None:
                self.stat_update("empty_tex/no_main")
                continue
            if not result.body.strip():
                self.stat_update("empty_tex/no_text")
                continue
            self.stat_update("converted")
            doc.text = result.text(doc.metadata.get("title"), doc.metadata.get("abstract"))
            doc.metadata["main_file"] = result.main
            yield doc
