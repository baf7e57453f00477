"""What the LaTeX converter does with each macro and environment (decisions documented here).

- Math ($..$, $$..$$, \\(..\\), \\[..\\], equation/align/gather/multline/eqnarray...): kept as
  LaTeX source, user macros expanded, ``\\label{..}`` removed.
- Dropped whole: figures, tables and tabulars (cells linearise into noise without their grid),
  bibliography, pictures/TikZ, algorithms, comments; \\cite*, \\ref* (dropped, not replaced by a
  number, as in the digest; the brackets and list separators around them go too: "(\\citet{a};
  \\citet{b})" and "(see, e.g., \\cite{a})" give nothing, "of \\cite{a}'s" "of"; a reference noun
  before them reads as a noun, "in Eq.~(\\ref{e})," "in the equation,", as does a \\cref whose label
  names its kind, `latex_references`), \\label, \\footnote (mostly affiliations/acknowledgements, and
  inline insertion breaks sentences), \\url (either form) and \\href's URL, \\includegraphics,
  spacing and layout commands.
- Kept: text of formatting macros (\\emph, \\textbf, \\href's and \\hyperref's text...), lists
  as "- item", sections as Markdown headings, theorem-like environments as "Theorem. ...",
  verbatim/listings as ``` fences (their markup is content, and the leak metric skips fences and
  inline code), including the environments a paper declares (\\lstnewenvironment, \\newminted...,
  `latex_declared`), inline code (\\verb, \\Verb, short verbs such as |x| after
  \\MakeShortVerb{\\|}, \\lstinline, \\mintinline, \\path, \\newmintinline's commands) in
  backticks, \\mint's code (and \\newmint's commands') as a ``` fence and \\nolinkurl's text, all
  exactly as written (no ~, -- or macro is interpreted in them); declarations dropped, with their
  code and options. alltt is LaTeX (its macros and braces work) in a ``` fence that keeps its
  lines and spaces. TeX's `quote' is written 'quote', so a backtick marks code. \\char gives its
  character (\\char`\\\\, \\char`\\{, \\char92, \\char"5C), as in a typewriter font.
Argument shapes for macros not listed come from pylatexenc's macro database.
"""

from __future__ import annotations

from functools import lru_cache

from pylatexenc import latex2text, latexwalker

HEADINGS = {
    "part": "#", "chapter": "#", "section": "##", "subsection": "###", "subsubsection": "####",
}
RUN_IN_HEADINGS = frozenset({"paragraph", "subparagraph"})

MATH_ENVS = frozenset(
    f"{base}{star}" for base in (
        "equation", "align", "alignat", "gather", "multline", "flalign", "eqnarray", "displaymath",
        "math", "dmath", "dgroup", "xalignat", "xxalignat", "aligned", "gathered", "split",
    ) for star in ("", "*")
)
DROP_ENVS = frozenset(
    f"{base}{star}" for base in (
        "figure", "table", "wrapfigure", "wraptable", "SCfigure", "subfigure", "tabular", "tabularx",
        "tabulary", "longtable", "supertabular", "thebibliography", "tikzpicture", "picture",
        "pspicture", "comment", "algorithm", "algorithmic", "algorithm2e", "filecontents",
        "titlepage", "abstract", "keywords", "keyword", "PACS", "IEEEkeywords", "CCSXML",
        "acks-hidden", "references", "sidewaystable", "sidewaysfigure", "tabu", "frontmatter",
        "icmlauthorlist",
    ) for star in ("", "*")
)
# Literal spans (`latex_source.LiteralSpans`) kept: inline code in backticks, text as is.
LITERAL_CODE = frozenset({"verb", "Verb", "lstinline", "mintinline", "path"})
LITERAL_BLOCK = frozenset({"mint"})  # minted's one-line display: a fenced block, as its environment
LITERAL_TEXT = frozenset({"nolinkurl"})
# Shown as code though not literal: the body as written up to its \end. The literal (verbatim-like)
# environments, their roles and arguments are `latex_declared.LITERAL_ENVS`.
CODE_ENVS = frozenset({"code"})
# LaTeX (macros, braces, math) converted as usual, with its lines and spaces kept: a ``` block.
LINE_ENVS = frozenset({"alltt"})
LIST_ENVS = frozenset({"itemize", "enumerate", "description", "list", "compactitem", "compactenum"})
THEOREMS = {
    "theorem": "Theorem", "thm": "Theorem", "lemma": "Lemma", "lem": "Lemma",
    "corollary": "Corollary", "cor": "Corollary", "proposition": "Proposition",
    "prop": "Proposition", "definition": "Definition", "defn": "Definition", "remark": "Remark",
    "example": "Example", "conjecture": "Conjecture", "claim": "Claim", "proof": "Proof",
    "note": "Note", "problem": "Problem", "exercise": "Exercise", "assumption": "Assumption",
}
HEADING_ENVS = {"acknowledgments": "Acknowledgments", "acknowledgements": "Acknowledgements",
                "acknowledgment": "Acknowledgment", "acknowledgement": "Acknowledgement",
                "acks": "Acknowledgments", "appendix": "Appendix", "appendices": "Appendix"}
# Argument shapes of the environments whose body is read (pylatexenc notation: '[' optional, '{'
# mandatory, '*' star); dropped ones need none, literal ones have theirs in `LITERAL_ENVS`.
ENV_ARGS = {"minipage": "[[[{", "multicols": "{", "multicols*": "{", "list": "{{", "alltt": "", "code": "",
            "otherlanguage": "{", "spacing": "{", "adjustbox": "{", "IEEEbiography": "[{"}

# Macro -> shape of the arguments dropped with it. A braced argument after them (\href{url}{TEXT},
# \textcolor{red}{TEXT}) is an ordinary group, so its text is kept.
DROP = {name: "*[{" for name in (
    "label", "ref", "eqref", "pageref", "autoref", "cref", "Cref", "vref", "nameref", "url",
    "nocite", "bibliography", "bibliographystyle", "thanks", "pagestyle", "thispagestyle",
    "pagenumbering", "usepackage", "documentclass", "RequirePackage", "title", "author",
    "date", "address", "affiliation", "affil", "email", "keywords", "pacs", "institute",
    "titlerunning", "authorrunning", "subjclass", "received", "accepted", "vspace", "hspace",
    "vskip", "hskip", "input", "include", "includeonly", "hypersetup", "graphicspath",
    "linespread", "setstretch", "fontsize", "color", "pagecolor", "newtheorem", "theoremstyle",
    "newenvironment", "renewenvironment", "provideenvironment", "newcounter", "numberwithin", "captionsetup",
    "setlist", "geometry", "crefname", "Crefname", "newlength", "urlstyle", "begingroup",
    "tableofcontents", "listoffigures", "listoftables", "caption", "footnotetext", "footnotemark",
    "IEEEoverridecommandlockouts", "IEEEpeerreviewmaketitle", "markboth", "runningtitle",
    "shorttitle", "shortauthors", "orcid", "ead", "tnotetext", "fntext", "cortext", "corref",
    "acmConference", "acmYear", "copyrightyear", "setcopyright", "ccsdesc", "vfill", "hfill",
    # front matter of amsart (math), revtex (physics), aastex (astro-ph) and AAAI, often
    # written in the body before \maketitle
    "curraddr", "urladdr", "dedicatory", "altaffiliation", "collaboration", "preprint",
    "homepage", "correspondingauthor", "submitjournal", "revised", "affiliations",
)}
# set-up and file commands met in the body: their arguments are options, keys and file names
DROP.update({"includestandalone": "[{", "includesvg": "[{", "includepdf": "[{", "tikzset": "{",
             "pgfplotsset": "{", "usetikzlibrary": "{", "usepgfplotslibrary": "{", "lstset": "{",
             "sisetup": "{", "tcbset": "{", "pgfkeys": "{", "DeclareGraphicsExtensions": "{",
             "addbibresource": "[{", "newgeometry": "{", "printbibliography": "[",
             "algrenewcommand": "{{", "algnewcommand": "{{", "SetKwInOut": "{{", "SetKw": "{{",
             "SetKwFunction": "{{", "SetKwProg": "{{{{"})
DROP.update(dict.fromkeys(("NewDocumentCommand", "RenewDocumentCommand", "ProvideDocumentCommand",
                           "DeclareDocumentCommand"), "{{{"))  # one `latex_macros` left in place
DROP.update({
    "cite": "*[[{", "citep": "*[[{", "citet": "*[[{", "citealp": "*[[{", "citealt": "*[[{",
    "citeauthor": "*[[{", "citeyear": "*[[{", "parencite": "*[[{", "textcite": "*[[{",
    "footnote": "[{", "includegraphics": "*[[{", "setlength": "{{", "addtolength": "{{",
    "setcounter": "{{", "addtocounter": "{{", "addcontentsline": "{{{", "renewcommand": "*{[[{",
    "newcommand": "*{[[{", "providecommand": "*{[[{", "newcolumntype": "{[{",
    "definecolor": "{{{", "colorlet": "{{", "rule": "[{{", "raisebox": "{[[", "resizebox": "*{{",
    "scalebox": "{[", "let": "", "DeclareMathOperator": "*{{", "bibitem": "[{", "href": "{", "hyperref": "[",
    "textcolor": "[{", "colorbox": "[{", "foreignlanguage": "[{", "parbox": "[[[{",
    "makebox": "[[", "framebox": "[[", "selectlanguage": "{", "multicolumn": "{{",
    "multirow": "[{[{",
    # ICML's title block, written in the body (in \twocolumn[...], whose text is read:
    # `latex_convert`): title, authors, affiliations
    "icmltitle": "{", "icmltitlerunning": "{", "icmlsetsymbol": "{{",
    "icmlauthor": "{{", "icmlaffiliation": "{{", "icmlcorrespondingauthor": "{{",
    "icmlkeywords": "{", "printAffiliationsAndNotice": "{",
    # index, glossary and nomenclature entries: printed in their lists, not where they stand
    "index": "{", "glossary": "{", "nomenclature": "[{{", "printindex": "[", "printnomenclature": "[",
    # the import package's includes, when the file is not in the archive (`latex_source`)
    **dict.fromkeys(("import", "subimport", "inputfrom", "subinputfrom", "includefrom",
                     "subincludefrom"), "*{{"),
})
# References and citations: dropped, and the brackets they leave empty with them (`latex_convert`)
# The citation commands of natbib (capitalised too), biblatex, revtex, ACM and apacite: their keys
# came out as text ("[p. 3]key1,key2") when they were not listed in DROP.
_CITATION_NAMES = (
    "cite", "citep", "citet", "citealp", "citealt", "citeauthor", "citeyear", "citeyearpar", "citenum",
    "onlinecite", "fullcite", "footcite", "footcitetext", "autocite", "parencite", "textcite",
    "smartcite", "supercite", "shortcite", "citeN", "citeNP", "shortciteN", "citeA", "citeNA",
    "citepalias", "citetalias",
)
CITATIONS = frozenset(name for base in _CITATION_NAMES for name in (base, base[0].upper() + base[1:]))
DROP.update(dict.fromkeys(CITATIONS - DROP.keys(), "*[[{"))
# cleveref's, varioref's, subfig's, zref-clever's and hyperref's other references: their label keys
# came out as text ("see eq:aeq:b" for \crefrange{eq:a}{eq:b}, "Tables a and b" for \subref)
OTHER_REFERENCES = {
    **dict.fromkeys(("crefrange", "Crefrange", "cpagerefrange", "Cpagerefrange"), "*{{"), "vrefrange": "*[{{",
    **dict.fromkeys(("labelcref", "labelcpageref", "namecref", "nameCref", "lcnamecref", "namecrefs", "nameCrefs",
                     "lcnamecrefs", "cpageref", "Cpageref", "subref", "Autoref"), "*{"),
    **dict.fromkeys(("Vref", "zcref", "zcpageref"), "*[{"), "vpageref": "*[[{", "Vpageref": "*[[{",
}
DROP.update(OTHER_REFERENCES)
REFERENCES = frozenset({"ref", "eqref", "pageref", "autoref", "cref", "Cref", "vref", "nameref", *OTHER_REFERENCES}
                       | CITATIONS)
TEXT_SYMBOLS = {
    "LaTeX": "LaTeX", "TeX": "TeX", "LaTeXe": "LaTeX2e", "BibTeX": "BibTeX", "par": "\n\n",
    "newline": "\n", "linebreak": "\n", "item": "\n- ", "qquad": " ", "quad": " ",
    "dots": "…", "ldots": "…", "textbackslash": "\\", "ie": "i.e.", "eg": "e.g.", "etal": "et al.",
    # text symbols pylatexenc has no replacement for, so they were dropped ("see 3" for \S 3)
    "S": "§", "P": "¶", "copyright": "©", "pounds": "£", "euro": "€", "textless": "<",
    "textgreater": ">", "textunderscore": "_", "textbar": "|", "textquotedbl": '"',
}
ACCENTS = frozenset("'`^\"~=.")
ACCENT_WORDS = frozenset("c u v H r d b k t".split())

_WALKER_DB = latexwalker.get_default_latex_context_db()
_TEXT_DB = latex2text.get_default_latex_context_db()


@lru_cache(maxsize=4096)
def macro_args(name: str) -> str:
    """Argument shape of a macro we have no rule for, from pylatexenc (empty if unknown)."""
    spec = _WALKER_DB.get_macro_spec(name)
    return getattr(getattr(spec, "args_parser", None), "argspec", "") if spec else ""


def known_macro(name: str) -> bool:
    """Whether pylatexenc's database knows the macro `name` (LaTeX's or a common package's)."""
    return _WALKER_DB.get_macro_spec(name) is not None


def known_env(name: str) -> bool:
    """Whether pylatexenc's database knows the environment `name`."""
    return _WALKER_DB.get_environment_spec(name) is not None


@lru_cache(maxsize=4096)
def env_args(name: str) -> str:
    if name in ENV_ARGS:
        return ENV_ARGS[name]
    spec = _WALKER_DB.get_environment_spec(name)
    return getattr(getattr(spec, "args_parser", None), "argspec", "") if spec else ""


@lru_cache(maxsize=4096)
def symbol_text(name: str) -> str | None:
    """Unicode for an argument-free text symbol (\\ss, \\aa, \\textendash...) per pylatexenc."""
    if name in TEXT_SYMBOLS:
        return TEXT_SYMBOLS[name]
    spec = _TEXT_DB.get_macro_spec(name)
    repl = getattr(spec, "simplify_repl", None) if spec else None
    if isinstance(repl, str) and "%" not in repl and not macro_args(name):
        return repl
    return None


@lru_cache(maxsize=4096)
def accent_text(accent: str, letter: str) -> str:
    """`\\'{e}` -> 'é' via pylatexenc's latex2text (cached: there are few distinct pairs)."""
    try:
        return latex2text.LatexNodes2Text().latex_to_text(f"\\{accent}{{{letter}}}")
    except Exception:  # pylatexenc raises several types on odd input; fall back to the letter
        return letter
