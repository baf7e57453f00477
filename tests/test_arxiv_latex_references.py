"""Cross-references and citations in converted LaTeX: what a dropped \\ref leaves reads as prose."""

from __future__ import annotations

import pytest
from linear_time import assert_linear

from kiln.data.arxiv import latex_to_text
from kiln.data.arxiv.latex_convert import LatexConverter


def text(tex: str) -> str:
    return LatexConverter(tex).text()


@pytest.mark.parametrize(("tex", "expected"), [
    ("As shown in Eq.~\\eqref{e}, the loss falls.", "As shown in the equation, the loss falls."),
    ("As shown in Eq.~\\eqref{e}; the loss falls.", "As shown in the equation; the loss falls."),
    ("(see Eq.~\\eqref{e}) and (see Fig.~\\ref{f}).", "(see the equation) and (see the figure)."),
    ("See Fig.~\\ref{f}.", "See the figure."),
    ("See Figs.~\\ref{a} and~\\ref{b}, which show it.", "See the figures, which show it."),
    ("Section~\\ref{s} shows it. Table \\ref{t} too.", "The section shows it. The table too."),
    ("in Section~\\ref{s}, we show", "in the section, we show"),
    ("see Eqs.~(\\ref{a})--(\\ref{b}), which", "see the equations, which"),
    ("Theorem~\\ref{t} holds by Lemmas~\\ref{a}, \\ref{b} and~\\ref{c}.",
     "The theorem holds by the lemmas."),
    ("by equation (\\ref{e}) and Appendix~\\ref{a}: done", "by the equation and the appendix: done"),
    ("the proof of our Theorem~\\ref{t} and the main Lemma~\\ref{l}.",
     "the proof of our theorem and the main lemma."),
    ("In Fig.~\\ref{f}a the curve", "In the figure the curve"),
    ("as in Ref.~\\cite{a}, and Refs.~\\cite{a,b}.", "as in the reference, and the references."),
    ("Eq.~\\eqref{e}: it holds.", "The equation: it holds."),
])
def test_a_reference_after_its_noun_reads_as_the_noun(tex, expected):
    """A dropped \\ref left the noun that announced it dangling: 'As shown in Eq., the loss
    falls.', 'See Figs., which', 'Section shows it.', 'see Eqs.–, which'. The noun and its
    reference now read as the noun with an article ('the equation', 'the figures'), which is
    what the sentence says without the number; after a determiner ('our Theorem~\\ref{t}') the
    article is not doubled."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("by \\cref{thm:a}, we get", "by the theorem, we get"),
    ("\\Cref{fig:x,fig:y} show it.", "The figures show it."),
    ("in \\autoref{sec:intro}.", "in the section."),
    ("by \\cref{main}, we get", "by, we get"),  # no kind in the label: dropped as before
])
def test_a_cleveref_reference_reads_as_its_kind(tex, expected):
    """\\cref and \\autoref print the kind with the number ('Theorem 3'): dropped, they left a hole
    ('by, we get'). The label's prefix (thm:, fig:, sec:...) names the kind."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("it holds (see \\cite{a}) and (see, e.g., \\cite{a,b}) and (cf.~\\cite{x}).", "it holds and and."),
    ("as known [see also \\cite{a} and references therein].", "as known."),
])
def test_a_bracket_of_only_a_citation_lead_in_goes_with_it(tex, expected):
    """A bracket that held only 'see' or 'cf.' and citations read '(see)', '(see, e.g.,)', '(cf.)'."""
    assert text(tex) == expected


@pytest.mark.parametrize("make", [
    lambda k: "Eq." + " " * k + "\\ref{a} x",
    lambda k: "Eqs.~\\ref{a}" + " and~\\ref{b}" * k + ".",
    lambda k: "(see" + " " * k + "\\cite{a}" + " ," * k + ")",
    lambda k: "\\cref{thm:a}" * k + ".",
])
def test_reading_references_as_nouns_stays_linear(make):
    assert_linear(text, make, 2000)


@pytest.mark.parametrize(("tex", "expected"), [
    ("dans la section~\\ref{s} et", "dans la section et"),  # another language: as written
    ("Veja a \\autoref{sec:a}, que", "Veja a, que"),
    ("Combining Theorem~\\ref{t} with", "Combining the theorem with"),
    ("we invoke Theorem~\\ref{t} again", "we invoke Theorem again"),  # a verb it does not know
    ("input for\nEq.~(\\ref{e}) and\nSection~\\ref{s}", "input for the equation and the section"),
    ("Intro.\n\nSection~\\ref{s} ends.", "Intro.\n\nThe section ends."),
])
def test_the_article_goes_only_where_the_word_before_is_english_it_knows(tex, expected):
    """'the' went before any reference noun: 'dans la the section', 'Veja a section'; and a line end
    in the source read as a sentence's start ('input for The equation'). A paragraph's start
    still gives 'The'."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("see \\crefrange{eq:a}{eq:b}.", "see the equations."),
    ("in \\namecref{sec:a}, and", "in the section, and"),
    ("by \\labelcref{a}, \\cpageref{b}, \\Vref{c}, \\vpageref[x]{d}, we", "by, we"),
    ("as in Fig.~\\subref{a} and \\subref*{b}.", "as in the figures."),
])
def test_other_reference_commands_drop_their_labels(tex, expected):
    """cleveref's \\crefrange, \\labelcref, \\namecref, \\cpageref, varioref's \\Vref and
    \\vpageref, subfig's \\subref were unknown macros: their label keys came out as text ('see
    eq:aeq:b', 'Fig. a')."""
    assert text(tex) == expected


def test_that_before_a_reference_noun_is_a_conjunction():
    """'note that Theorem~\\ref{t} yields' read 'note that theorem yields', 'that' taken for a
    determiner (aomart's sample paper)."""
    assert text("We note that Theorem~\\ref{t} yields it.") == "We note that the theorem yields it."


@pytest.mark.parametrize(("tex", "expected"), [
    ("by \\cref{thm:a} and \\cref{lem:b}, we", "by the theorem and the lemma, we"),
    ("by \\cref{thm:a,thm:b} and \\cref{lem:c}, we", "by the theorems and the lemma, we"),
    ("by \\cref{thm:a} and \\cref{thm:b}, we", "by the theorems, we"),
])
def test_a_run_of_cleveref_references_reads_each_kind(tex, expected):
    """'\\cref{thm:a} and \\cref{lem:b}' read 'the theorems', one kind for the run."""
    assert text(tex) == expected


def test_a_reference_noun_at_the_bodys_start_reads_as_one():
    """The body starts after \\begin{document}'s line end, which the sentence-start rule did not
    take for a start: 'Eq.~\\eqref{a}--\\eqref{b} hold.' read 'Eq. hold.'"""
    files = {"main.tex": "\\documentclass{article}\n\\begin{document}\nEq.~\\eqref{a}--\\eqref{b} hold.\n\\end{document}"}
    assert latex_to_text(files).body == "The equations hold."


@pytest.mark.parametrize(("tex", "expected"), [
    ("As shown in Figure~\\ref{fig:a}(b), x", "As shown in the figure, x"),
    ("see Figures~\\ref{a}(a) and~\\ref{a}(b), and Lemma~\\ref{l}(ii).", "see the figures, and the lemma."),
])
def test_a_sub_label_stuck_to_a_reference_goes_with_it(tex, expected):
    """A sub-label after the reference stayed stuck to the noun: 'the figure(b)', 'the lemma(ii)'."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("It ends. (Table~\\ref{t} shows it.)", "It ends. (The table shows it.)"),
    ("\\subsection{Equation on the Page}Equation~\\ref{e} is one.", "### Equation on the Page\n\nThe equation is one."),
])
def test_a_sentence_start_after_a_bracket_or_heading_reads_the(tex, expected):
    """A parenthesised sentence read '(the table shows', and after a heading ending in 'the Page'
    the heading's words were taken for a determiner and adjective: 'equation is one'."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("the arguments, Sec.~\\ref{s}.", "the arguments, Sec."),
    ("des entrées, Eq.~\\eqref{e}.", "des entrées, Eq."),
    ("Dans (illustré \\vref{fig-a}), les", "Dans (illustré), les"),
    ("la convention précisée \\cref{sec:a}).", "la convention précisée)."),
])
def test_a_noun_left_as_written_keeps_the_clean_up_of_its_reference(tex, expected):
    """Where the word before is none the rule knows, the noun stays as written: it was written out
    with its reference consumed, so the clean-up no longer saw the period or blank around it
    ('Sec.~\\ref{s}.' read 'Sec..', a French '(illustré \\vref{f})' '(illustré )', both on the
    TeX Live corpus). The run stays for the clean-up, as before the nouns were read."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("locales (cf.~\\cref{sec:a}).", "locales (cf. the section)."),
    ("shown (cf.~Section~\\ref{s}).", "shown (cf. the section)."),
    ("shown [cf.~Fig.~\\ref{f}].", "shown [cf. the figure]."),
])
def test_an_abbreviation_after_a_bracket_starts_no_sentence(tex, expected):
    """'(cf.~Section~\\ref{s})' read '(cf. The section)': the abbreviation was looked up with its
    bracket ('(cf.'), missed, and its period taken for a sentence's end."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("Wie in Definition~\\ref{d} gezeigt, ist die Menge nicht leer und von der Form.",
     "Wie in Definition gezeigt, ist die Menge nicht leer und von der Form."),
    ("Diese Pakete sind erforderlich (Tab.~\\ref{t}). Die Pakete werden mit der Klasse geladen.",
     "Diese Pakete sind erforderlich (Tab.). Die Pakete werden mit der Klasse geladen."),
    ("Il est possible de les définir (cf.~\\cref{sec:a}) pour la classe et les options.",
     "Il est possible de les définir pour la classe et les options."),
])
def test_a_text_in_another_language_keeps_its_nouns_as_written(tex, expected):
    """The word before was the only test of English, and 'in', a bracket or 'cf.' passed it in
    German and French too: 'Wie in the definition gezeigt', '(the table)', '(cf. the section)'
    (the last two on the TeX Live corpus; a bracket of 'cf.' and a reference alone goes, as
    before). A text with fewer of English's commonest words than of the other languages' keeps
    its nouns as written, as before they were read."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("They turn out to be Eqs.~(\\ref{a}), (\\ref{b}), and (\\ref{c}).", "They turn out to be Eqs."),
    ("It was (\\ref{a}), (\\ref{b}), and (\\ref{c}) here.", "It was here."),
])
def test_a_run_of_bracketed_references_left_goes_whole(tex, expected):
    """A run of bracketed references with no phrase read for it went to the clean-up, which takes
    a bracket of one run only: 'Eqs.,, and.' (revtex's aapm sample). It goes as one mark."""
    assert text(tex) == expected


@pytest.mark.parametrize(("tex", "expected"), [
    ("Thm.~\\ref{t}, Lem.~\\ref{l}, and Cor.~\\ref{c} show it.", "The theorem, the lemma, and the corollary show it."),
    ("By Lemmas~\\ref{a} and~\\ref{b}, Theorem~\\ref{t} holds.", "By the lemmas, the theorem holds."),
])
def test_a_list_of_reference_nouns_reads_each(tex, expected):
    """A noun after another's reference and a comma kept its abbreviation, the word before being
    the reference: 'The theorem, Lem., and the corollary show it.'"""
    assert text(tex) == expected
