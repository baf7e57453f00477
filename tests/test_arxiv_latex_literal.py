"""LaTeX literal spans beyond \\verb and \\url: \\mint, \\Verb, short verbs (\\MakeShortVerb{\\|}) and
verbatim-like environment bodies, whose braces, % and \\end must not reach the LaTeX reader."""

from __future__ import annotations

from pathlib import Path

from kiln.data.arxiv import latex_to_text
from kiln.data.arxiv.latex_declared import LITERAL_ENVS, ROLE_CODE
from kiln.data.arxiv.latex_literal import Declared, LiteralSpans
from kiln.data.arxiv.latex_source import split_document, strip_comments

FIXTURES = Path(__file__).parent / "fixtures" / "latex"


def body(tex: str, preamble: str = "") -> str:
    doc = f"\\documentclass{{article}}{preamble}\\begin{{document}}{tex}\\end{{document}}"
    return latex_to_text({"main.tex": doc}).body


def test_mint_is_a_literal_display():
    assert strip_comments("\\mint{python}|a % b| \\mint[linenos]{c}{d = {1: 2} % x} % c\nz") == (
        "\\mint{python}|a % b| \\mint[linenos]{c}{d = {1: 2} % x} z")
    assert strip_comments("\\mint{c}|a % b\nz") == "\\mint{c}|a z"  # unclosed on its line: a comment
    pre = "\\newcommand{\\x}{XX}"
    assert body("a \\mint{tex}|\\x{}--| b \\mint{python}{d = {1: 2}} \\x", pre) == (
        "a\n\n```\n\\x{}--\n```\n\nb\n\n```\nd = {1: 2}\n```\n\nXX")


def test_fancyvrb_Verb_is_inline_code():
    assert strip_comments("\\Verb|a%b| \\Verb*!x % y! \\Verb[fontsize=\\small]+p%+ \\Verb{q{}%} % c\nz") == (
        "\\Verb|a%b| \\Verb*!x % y! \\Verb[fontsize=\\small]+p%+ \\Verb{q{}%} z")
    assert body("\\Verb|a{b| and \\Verb*!x--y! and \\Verb{e{}f} end") == "`a{b` and `x--y` and `e{}f` end"
    assert strip_comments("\\Verbatimx|a % b|") == "\\Verbatimx|a "  # another command: no span


def test_short_verb_declarations_start_and_end_literal_spans():
    # After \MakeShortVerb{\|}, |..| on one line is \verb|..|; `\|` is the control symbol (a norm).
    assert strip_comments("a|b % c\n\\MakeShortVerb{\\|} \\|x\\| % d\n|a%b| \\\\|c%d| % e\nz") == (
        "a|b \\MakeShortVerb{\\|} \\|x\\| |a%b| \\\\|c%d| z")
    text = "\\MakeShortVerb*{\\|}|a%| \\DeleteShortVerb{\\|} |b% c\nz"
    assert strip_comments(text) == "\\MakeShortVerb*{\\|}|a%| \\DeleteShortVerb{\\|} |bz"
    text = "\\lstMakeShortInline[columns=fixed]!!a%! \\lstDeleteShortInline! !b% c\nz"
    assert strip_comments(text) == "\\lstMakeShortInline[columns=fixed]!!a%! \\lstDeleteShortInline! !bz"
    assert strip_comments("\\DefineShortVerb{\\+}+a%+ \\UndefineShortVerb{\\+}+b% c\nz") == (
        "\\DefineShortVerb{\\+}+a%+ \\UndefineShortVerb{\\+}+bz")
    # A declaration inside a literal span declares nothing; a state can be handed on.
    assert strip_comments("\\verb|\\MakeShortVerb{\\!}| !a% c\nz") == "\\verb|\\MakeShortVerb{\\!}| !az"
    assert strip_comments("|a%b| % c\nz", Declared(short="|")) == "|a%b| z"
    spans = LiteralSpans("x \\MakeShortVerb{\\|} |y| \\lstMakeShortInline\" z \\DeleteShortVerb\\| w")
    assert [s.kind for s in spans.spans] == ["shortverb", "verb", "shortverb", "shortverb"]
    assert [spans.declared_at(at).short for at in (0, 22, 99)] == ["", "|", '"']


def test_short_verbs_render_as_code_through_preamble_and_includes():
    pre = "\\newcommand{\\x}{XX}\\MakeShortVerb{\\|}"
    out = body("use |\\x{a}%| and \\x\\footnote{see |}|} here \\DeleteShortVerb{\\|} $|y|$ % c\nz", pre)
    assert out == "use `\\x{a}%` and XX here $|y|$ z"
    # An included file is read with the short verbs in force at its \input.
    files = {"main.tex": "\\documentclass{article}\\MakeShortVerb{\\\"}\\begin{document}A \\input{sec} B\\end{document}",
             "sec.tex": "in \"a%b\" % c\nq"}
    assert latex_to_text(files).body == "A in `a%b` q B"


def test_verbatim_bodies_do_not_unbalance_what_follows():
    # Old: the `{` of the verbatim inside the footnote closed with the comment's `}`, so the
    # footnote swallowed the paragraph; the `\end{itemize}` in the verbatim closed the list and
    # emptied the code block; |..| and \Verb, \mint were read as LaTeX.
    result = latex_to_text({"main.tex": (FIXTURES / "verbatim.tex").read_text()})
    assert result.text() == (
        "Title: Literal Text in Papers\nAbstract: Code such as `f{x}` stays as written.\n"
        "Body: ```\nint main() { % not a comment\n```\n\n## Setup\n\nWe configure the parser. It works.\n\n"
        "- A list item with code:\n\n```\n\\end{itemize}\n```\n\n- Second item.\n\n"
        "A note and the text goes on.\n\n```\nif (x) { y(); % kept\n```\n\n```\nd = {1: [2,\n```\n\n"
        "## Inline forms\n\nType `a%b{` or `c%d}` or `e{}f` and\n\n```\nprint(\"%d\" % x{)\n```\n\n"
        "Then $|x|$ is math again, as is `a%b`.")
    assert "unbalanced" not in result.body and "Dropped" not in result.body


def test_environment_bodies_and_arguments():
    # The body starts after the environment's arguments, whatever braces they hold.
    assert body("A\\footnote{\\begin{Verbatim}[commandchars=\\\\\\{\\}]\nx}\n\\end{Verbatim} B} after") == "A after"
    assert body("\\begin{BVerbatim}\n\\textbf{x} {\n\\end{BVerbatim} after") == "```\n\\textbf{x} {\n```\n\nafter"
    assert body("\\section{A \\footnote{\\begin{comment}}\\end{comment}} B} text") == "## A B\n\ntext"
    for env, (role, args) in LITERAL_ENVS.items():  # each is shown as code or dropped, never read as LaTeX
        given = "".join("[o]" if shape == "[" else "{a}" for shape in args)
        out = body(f"\\begin{{{env}}}{given}\n\\textbf{{x}} {{\n\\end{{{env}}} after")
        assert out == ("```\n\\textbf{x} {\n```\n\nafter" if role == ROLE_CODE else "after"), env


def test_end_document_inside_verbatim_does_not_end_the_body():
    tex = "A\n\\begin{verbatim}\n\\begin{document}x\\end{document}\n\\end{verbatim}\nB"
    assert body(tex) == "A\n\n```\n\\begin{document}x\\end{document}\n```\n\nB"
    pre = "\\begin{filecontents}{ex.tex}\\begin{document}y\\end{document}\\end{filecontents}"
    assert body("C", pre) == "C"
    assert split_document("p\\begin{document}b\\end{document}t") == ("p", "b")
