"""LaTeX macros as TeX scopes them: \\provide* defines only what is undefined; a definition
made inside a group holds to the group's end; a redefinition holds from where it stands."""

from __future__ import annotations

import pytest

from kiln.data.arxiv import latex_to_text


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
