"""Declared verbatim-like environments and commands (\\lstnewenvironment, \\newminted,
\\DefineVerbatimEnvironment, \\newtcblisting, the comment package), alltt, and the title, abstract
and macro arguments read around literal spans."""

from __future__ import annotations

from linear_time import assert_linear

from kiln.data.arxiv import latex_to_text, leaked_markup
from kiln.data.arxiv.latex_literal import LiteralSpans
from kiln.data.arxiv.latex_source import strip_comments

# A body that unbalances the text after it when read as LaTeX: an unclosed brace, a % comment
# and an \end of the list around it.
CODE = "\nif (a) { % not a comment\n\\end{itemize}\n"


def body(tex: str, preamble: str = "") -> str:
    doc = f"\\documentclass{{article}}{preamble}\\begin{{document}}{tex}\\end{{document}}"
    return latex_to_text({"main.tex": doc}).body


def fenced(code: str) -> str:
    return f"```\n{code.strip(chr(10))}\n```"


def test_declared_environments_are_code_blocks():
    cases = [  # (preamble, \begin{..} with its arguments, \end{..})
        ("\\lstnewenvironment{code}[1][]%\n  {\\lstset{#1}}%\n  {}", "\\begin{code}[language=C]", "\\end{code}"),
        ("\\lstnewenvironment{src}[2][x]{}{}", "\\begin{src}[a]{b}", "\\end{src}"),
        ("\\newminted{python}{frame=single}", "\\begin{pythoncode}", "\\end{pythoncode}"),
        ("\\newminted{python}{}", "\\begin{pythoncode*}{linenos}", "\\end{pythoncode*}"),
        ("\\newminted[py]{python}{}", "\\begin{py}", "\\end{py}"),
        ("\\DefineVerbatimEnvironment{vb}{Verbatim}{frame=single}", "\\begin{vb}[numbers=left]", "\\end{vb}"),
        ("\\RecustomVerbatimEnvironment{Verbatim}{Verbatim}{}", "\\begin{Verbatim}", "\\end{Verbatim}"),
        ("\\CustomVerbatimEnvironment{vb}{BVerbatim}{}", "\\begin{vb}[x]", "\\end{vb}"),
        ("\\newtcblisting{box}[1]{title=#1}", "\\begin{box}{Title}", "\\end{box}"),
        ("\\DeclareTCBListing{ml}{ O{} m }{#1}", "\\begin{ml}[t]{u}", "\\end{ml}"),
        ("\\NewTCBListing[auto counter]{ml}{ !O{} }{#1}", "\\begin{ml}[t]", "\\end{ml}"),
        ("\\RenewTCBListing{ml}{ m }{}\\ProvideTCBListing{pl}{}{}", "\\begin{ml}{x}", "\\end{ml}"),
        ("\\renewtcblisting{box}{}", "\\begin{box}", "\\end{box}"),
        ("", "\\begin{tcblisting}{colback=red}", "\\end{tcblisting}"),
        ("", "\\begin{spverbatim}", "\\end{spverbatim}"),
    ]
    for preamble, begin, end in cases:
        tex = f"\\begin{{itemize}}\\item A\n{begin}{CODE}{end}\n\\item B\\end{{itemize}} after"
        assert body(tex, preamble) == f"- A\n\n{fenced(CODE)}\n\n- B after", begin
        assert strip_comments(preamble + tex).count("% not a comment") == 1, begin
    # Only after the declaration: TeX reads an earlier \begin{code} as ordinary LaTeX.
    text = "\\begin{code}a % b\n\\end{code}\\lstnewenvironment{code}{}{}\\begin{code}c % d\n\\end{code}"
    assert strip_comments(text) == "\\begin{code}a \\end{code}\\lstnewenvironment{code}{}{}\\begin{code}c % d\n\\end{code}"
    # In the body, the declaration and its code and options are dropped with it.
    assert body("A \\lstnewenvironment{code}{\\lstset{x}}{} B\\begin{code}{\\end{code} C") == (
        "A B\n\n```\n{\n```\n\nC")


def test_declarations_in_a_local_package_hold_in_the_paper_and_its_includes():
    files = {"main.tex": "\\documentclass{article}\\usepackage{mine}\\begin{document}A \\input{sec} B\\end{document}",
             "mine.sty": "\\lstnewenvironment{py}{}{}",
             "sec.tex": "\\begin{py}\nx = a % b\n  y = 1\n\\end{py}"}
    assert latex_to_text(files).body == "A\n\n```\nx = a % b\n  y = 1\n```\n\nB"
    # an example document in a package-declared environment does not end the body
    files["sec.tex"] = "\\begin{py}\n\\begin{document} x \\end{document}\n\\end{py}"
    assert latex_to_text(files).body == "A\n\n```\n\\begin{document} x \\end{document}\n```\n\nB"
    # A package's definitions are read with the declarations of the packages before it (were: none).
    files = {"main.tex": "\\documentclass{article}\\usepackage{verbs,defs}\\begin{document}a \\lb{} b\\end{document}",
             "verbs.sty": "\\MakeShortVerb{\\|}", "defs.sty": "\\newcommand{\\lb}{|{|}"}
    assert latex_to_text(files).body == "a `{` b"


def test_minted_made_commands():
    pre = "\\newmint{python}{}\\newmint[pyline]{python}{}\\newmintinline[py]{python}{}\\newmintedfile[pyfile]{python}{}"
    assert body("A \\python|d = {1: 2} % x| B \\pyline{e{}} C \\py|f{%| D \\pyfile[linenos]{src/a_b.py} E", pre) == (
        "A\n\n```\nd = {1: 2} % x\n```\n\nB\n\n```\ne{}\n```\n\nC `f{%` D E")
    assert body("\\newmintinline{c}{} \\cinline|x{| ok") == "`x{` ok"
    assert body("\\python|x|") == "|x|"  # undeclared: not minted's


def test_comment_package_excluded_environments_are_dropped_and_included_ones_read():
    pre = ("\\usepackage{comment}\\excludecomment{hide}\\includecomment{show}\\excludeversion{long}"
           "\\includeversion{short}\\specialcomment{note}{\\begingroup}{\\endgroup}")
    tex = ("\\begin{itemize}\\item A \\begin{hide}" + CODE + "\\end{hide} B \\begin{long}{\\end{long}\\item C "
           "\\begin{show}shown \\emph{text}\\end{show}\\end{itemize} D \\begin{short}E\\end{short} "
           "\\begin{note}F\\end{note}")
    assert body(tex, pre) == "- A B\n- C shown text D E F"
    assert "not a comment" in strip_comments(pre + tex)  # the dropped body is not LaTeX either
    # \includecomment{comment} makes the built-in `comment` ordinary, until excluded again.
    tex = "A \\begin{comment}kept \\emph{c}\\end{comment} \\excludecomment{comment}\\begin{comment}x{\\end{comment} B"
    assert body(tex, "\\includecomment{comment}") == "A kept c B"
    spans = LiteralSpans("\\excludecomment{a}\\begin{a}x\\end{a}\\includecomment{a}\\begin{a}y\\end{a}")
    assert [s.kind for s in spans.spans] == ["excludecomment", "env", "includecomment"]
    assert [spans.declared_at(at).env("a") for at in (0, 20, 60)] == [None, ("drop", ""), ("latex", "")]


def test_alltt_is_latex_with_its_lines_kept():
    tex = "A\n\\begin{alltt}\n  \\textbf{int} x = \\{1\\};\n    \\x{} $a_1$\n\\end{alltt}\nB"
    assert body(tex, "\\newcommand{\\x}{XX}") == "A\n\n```\n  int x = {1};\n    XX $a_1$\n```\n\nB"
    # Its braces are groups: a footnote around it closes where LaTeX closes it.
    assert body("A\\footnote{\\begin{alltt}x}\\end{alltt}} B") == "A B"


def test_title_abstract_and_macro_arguments_skip_literal_spans():
    doc = "\\documentclass{article}\\title{Real}\\begin{document}%s\\end{document}"
    shown = "\\begin{verbatim}\n\\title{Fake}\\begin{abstract}Fake\\end{abstract}\n\\end{verbatim}\n"
    result = latex_to_text({"main.tex": doc % (shown + "\\begin{abstract}Real \\verb|\\end{abstract}|\\end{abstract} x")})
    assert (result.title, result.abstract) == ("Real", "Real `\\end{abstract}`")
    result = latex_to_text({"main.tex": doc % "\\title{The \\verb|}| operator}\\abstract{Uses \\verb|{|.} x"})
    assert (result.title, result.abstract) == ("The `}` operator", "Uses `{`.")
    # A definition shown in a declared verbatim is not collected; an argument holds a whole span.
    pre = "\\lstnewenvironment{code}{}{}\\newcommand{\\w}[1]{[#1]}"
    assert body("\\begin{code}\n\\newcommand{\\y}{Y}\n\\end{code}\n\\y \\w{\\verb|}|} end", pre) == (
        "```\n\\newcommand{\\y}{Y}\n```\n\n[`}`] end")


def test_leaked_markup_skips_inline_code_and_tex_quotes_are_not_backticks():
    assert leaked_markup("a `\\x{}` b `{` c\n```\n\\y{}\n```\nd \\z") == (1, 5)
    out = body("the `best' and ``good'' way, \\verb|\\x{}|")
    assert out == "the 'best' and \"good\" way, `\\x{}`" and leaked_markup(out) == (0, 5)


def test_many_declarations_stay_linear():
    def names(k: int) -> str:
        return "".join(f"\\excludecomment{{a{i}}}\\includecomment{{a{i % 7}}}\\begin{{a{i}}}x" for i in range(k))
    assert_linear(lambda text: strip_comments(text + "%"), names, 2_500)
    assert_linear(LiteralSpans, names, 2_500)
