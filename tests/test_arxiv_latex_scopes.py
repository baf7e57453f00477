"""LaTeX macros as TeX scopes them: \\provide* defines only what is undefined; a definition
made inside a group holds to the group's end; a redefinition holds from where it stands."""

from __future__ import annotations

import pytest
from linear_time import assert_linear

from kiln.data.arxiv import latex_to_text
from kiln.data.arxiv.latex_scopes import MAX_STRETCHES


def body(tex: str, preamble: str = "") -> str:
    doc = f"\\documentclass{{article}}{preamble}\\begin{{document}}{tex}\\end{{document}}"
    return latex_to_text({"main.tex": doc}).body


@pytest.mark.parametrize(("preamble", "tex", "expected"), [
    ("\\newenvironment{foo}{<}{>}", "\\provideenvironment{foo}{[}{]}\\begin{foo}in\\end{foo}", "<in>"),
    ("", "\\provideenvironment{bar}{[}{]}\\begin{bar}in\\end{bar}", "[in]"),
    ("\\NewDocumentEnvironment{foo}{}{<}{>}", "\\ProvideDocumentEnvironment{foo}{}{[}{]}\\begin{foo}in\\end{foo}",
     "<in>"),
    ("\\newcommand{\\x}{A}", "\\providecommand{\\x}{B}\\x.", "A."),  # the preamble's, in the body
    ("\\newcommand{\\x}{A}", "\\providecommand*{\\x}{B}\\x.", "A."),
    ("", "\\providecommand{\\emph}[1]{X#1X}\\emph{hi}", "hi"),  # LaTeX's own \emph stays
    ("", "\\providecommand{\\tightlist}{}\\providecommand{\\R}{R}A\\tightlist\\R.", "AR."),
])
def test_provide_defines_only_what_is_undefined(preamble, tex, expected):
    """\\provideenvironment was no definition: 'foo[] <in>' came out, its code as text; and
    \\providecommand overrode a macro of the preamble read in the body, or LaTeX's own
    (\\emph), though \\provide* defines only a name not defined yet."""
    assert body(tex, preamble) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("{\\renewcommand{\\x}{B}\\x.} \\x.", "B. A."),
    ("\\begingroup\\renewcommand{\\x}{B}\\x.\\endgroup \\x.", "B. A."),
    ("\\begin{quote}\\renewcommand{\\x}{B}\\x.\\end{quote} \\x.", "B. A."),
    ("{\\def\\x{B}\\x.} \\x.", "B. A."),
    ("{\\let\\x\\y\\x.} \\x.", "Y. A."),
    ("{\\renewenvironment{foo}{[}{]}\\begin{foo}in\\end{foo}} \\begin{foo}out\\end{foo}", "[in] <out>"),
    ("{{\\renewcommand{\\x}{B}{\\renewcommand{\\x}{C}\\x.}\\x.}\\x.}\\x.", "C.B.A.A."),
    ("{\\gdef\\x{G}\\x.} \\x.", "G. G."),  # global: holds after its group
    ("{\\global\\def\\x{G}\\x.} \\x.", "G. G."),
    ("{\\global\\long\\def\\x{G}\\x.} \\x.", "G. G."),  # LyX's: \\long between read as local
    ("\\verb|{| {\\renewcommand{\\x}{B}\\x.} \\x.", "`{` B. A."),  # a literal brace opens no group
    ("\\x. \\renewcommand{\\x}{B}\\x.", "A. B."),  # from where it stands
    ("{\\newcommand{\\z}{Z}\\z.} \\x.", "Z. A."),
])
def test_a_definition_holds_where_tex_scopes_it(tex, expected):
    """The body's definitions made one table with the preamble's, later winning: a
    \\renewcommand, \\def or \\renewenvironment inside a group ({..}, \\begingroup, an
    environment) changed the text after the group, and one at top level the text before it
    ('{\\renewcommand{\\x}{B}\\x.} \\x.' read 'B. B.', TeX's 'B. A.')."""
    preamble = "\\newcommand{\\x}{A}\\newcommand{\\y}{Y}\\newenvironment{foo}{<}{>}"
    assert body(tex, preamble) == expected


def test_many_redefinitions_fall_back_to_one_table():
    """Each stretch of the body with its own meanings costs a table: past MAX_STRETCHES of them
    the body is expanded with one, later winning, as before (counted)."""
    tex = "{\\renewcommand{\\x}{B}\\x.}" * (MAX_STRETCHES + 5) + " \\x."
    doc = f"\\documentclass{{article}}\\newcommand{{\\x}}{{A}}\\begin{{document}}{tex}\\end{{document}}"
    result = latex_to_text({"main.tex": doc})
    assert result.body == "B." * (MAX_STRETCHES + 5) + " B."
    assert result.counts["macros_scopes_over_budget"] == 1


@pytest.mark.parametrize("make", [
    lambda k: "{\\renewcommand{\\x}{B}\\x}" * k,
    lambda k: "{\\renewcommand{\\x}{B}" + "{" * k + "\\x" + "}" * k + "}\\x",
    lambda k: "\\renewcommand{\\x}{B}" + "\\begingroup \\x " * k,
])
def test_scoping_definitions_stays_linear(make):
    def run(tex: str) -> str:
        doc = f"\\documentclass{{article}}\\newcommand{{\\x}}{{A}}\\begin{{document}}{tex}\\end{{document}}"
        return latex_to_text({"main.tex": doc}).body

    assert_linear(run, make, 2000)


def test_a_definition_removed_between_a_control_word_and_a_word_leaves_them_apart():
    """Removing `\\renewcommand{\\x}{B}` from `\\noindent\\renewcommand{\\x}{B}Hello` glued
    \\noindent to Hello: the unknown \\noindentHello was dropped with the word."""
    assert body("\\noindent\\renewcommand{\\x}{B}Hello \\x.", "\\newcommand{\\x}{A}") == "Hello B."
