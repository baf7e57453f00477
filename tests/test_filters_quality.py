"""Per-domain quality filters: crafted documents kept or dropped with the right reason."""

from __future__ import annotations

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from datatrove.pipeline.filters.base_filter import get_filter_result

from kiln.data.filters import quality_filters
from kiln.data.filters.code_rules import CodeLengthFilter, CodeRepetitionFilter

PROSE = (
    "The river valley was settled by farmers more than three thousand years ago, and the remains "
    "of their villages are still visible along the northern bank.\n"
    "Archaeologists have found pottery, grinding stones and the outlines of wooden houses that "
    "were rebuilt many times over the centuries.\n"
    "Most of the fields were watered by small canals that carried the spring floods to the higher "
    "terraces, which made it possible to grow wheat and barley in a dry climate.\n"
    "When the canals silted up, the villages moved closer to the river, and some of the older "
    "sites were abandoned for good.\n"
    "Today the valley is a protected area, and visitors can walk between the excavated houses on "
    "a marked trail that starts at the small museum near the bridge."
)
LATEX = (
    "We study the convergence of gradient descent on smooth objectives, and we show that the "
    "classical rate holds with an explicit constant.\n"
    "Let $f:\\mathbb{R}^d \\to \\mathbb{R}$ be an $L$-smooth function, and let "
    "$x_{t+1} = x_t - \\eta \\nabla f(x_t)$ denote the iterate at step $t$.\n"
    "\\begin{equation}\n"
    "  f(x_{t+1}) \\le f(x_t) - \\frac{\\eta}{2} \\| \\nabla f(x_t) \\|^2 .\n"
    "\\end{equation}\n"
    "Summing this inequality over $t$ shows that the average squared gradient norm decays at the "
    "rate $O(1/T)$ when the step size is at most $1/L$.\n"
    "The same argument applies to the stochastic setting, where a variance term is added to the "
    "bound in \\eqref{eq:descent}.\n"
    "We refer to \\cite{nesterov2004} for the classical treatment of these bounds and of their "
    "lower-bound counterparts.\n"
    "In the next section we extend the analysis to non-convex objectives that satisfy the "
    "Polyak--{\\L}ojasiewicz condition."
)
CODE = '''import json
from pathlib import Path


def load_records(path: Path) -> list[dict]:
    """Read one JSON object per line, skipping blank lines."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                records.append(json.loads(line))
    return records


def count_by_key(records: list[dict], key: str) -> dict[str, int]:
    """How many records carry each value of `key`."""
    counts: dict[str, int] = {}
    for record in records:
        value = str(record.get(key, "missing"))
        counts[value] = counts.get(value, 0) + 1
    return counts


class Summary:
    def __init__(self, path: Path, key: str):
        self.counts = count_by_key(load_records(path), key)

    def most_common(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]
'''
SHORT = "Click here to subscribe to our newsletter today."
REPETITIVE = "\n".join(["Buy cheap watches online at the best price in town today."] * 20)
BOILERPLATE = "\n".join(
    ["Home", "About us", "Products", "Contact", "Login", "Sign up", "Cart (0)", "Search"]
    + ["This website uses cookies to improve your experience and to analyse traffic and to "
       "show you personalised content.",
       "By continuing to browse the site you agree to our privacy policy and our terms of use.",
       "Copyright 2024 Example Shop Ltd. All rights reserved", "Follow us on social media",
       "Facebook", "Twitter", "Instagram", "Newsletter", "Enter your email address", "Subscribe",
       "Shipping", "Returns", "FAQ", "Careers", "Press", "Sitemap", "Accessibility"]
)


def first_drop(steps, text: str) -> tuple[str, str] | None:
    """Run the filters in order on one document: (filter class, reason) of the first drop."""
    doc = Document(text=text, id="t")
    for step in steps:
        kept, reason = get_filter_result(step.filter(doc))
        if not kept:
            return type(step).__name__, reason
    return None


def only(steps, cls):
    (match,) = [s for s in steps if isinstance(s, cls)]
    return match


@pytest.mark.parametrize("domain", ["prose", "latex", "code"])
def test_clean_prose_paragraph_is_kept_unchanged(domain):
    doc = Document(text=PROSE, id="p")
    for step in quality_filters(domain):
        assert get_filter_result(step.filter(doc)) == (True, None)
    assert doc.text == PROSE


def test_prose_drops_repetitive_boilerplate_and_short_with_reasons():
    prose = quality_filters("prose")
    assert first_drop(prose, REPETITIVE) == ("NewlineAwareGopherRepetitionFilter", "dup_line_frac")
    assert first_drop(prose, BOILERPLATE) == ("MeasuredC4QualityFilter", "too_few_sentences")
    # a one-line document already fails Gopher's top-2-gram share; the word-count rule names it
    assert first_drop(prose, SHORT) is not None
    assert get_filter_result(only(prose, GopherQualityFilter).filter(Document(SHORT, "s"))) == (
        False, "gopher_short_doc")


def test_latex_with_braces_kept_by_latex_config_but_dropped_by_prose_c4():
    prose_c4 = only(quality_filters("prose"), C4QualityFilter)
    assert get_filter_result(prose_c4.filter(Document(LATEX, "l"))) == (False, "curly_bracket")
    assert first_drop(quality_filters("prose"), LATEX) is not None
    doc = Document(text=LATEX, id="l")
    for step in quality_filters("latex"):
        assert get_filter_result(step.filter(doc)) == (True, None), type(step).__name__
    # no C4 line removal: equations and \begin lines survive, as written
    assert doc.text == LATEX
    assert not any(isinstance(s, FineWebQualityFilter) for s in quality_filters("latex"))


def test_latex_config_keeps_repetition_rules():
    assert first_drop(quality_filters("latex"), REPETITIVE) == ("NewlineAwareGopherRepetitionFilter", "dup_line_frac")


def test_code_kept_by_code_config_and_dropped_by_prose():
    assert first_drop(quality_filters("code"), CODE) is None
    assert first_drop(quality_filters("prose"), CODE) is not None


def test_code_config_drops_repeated_blocks_and_stubs():
    block = "def handler(event):\n    log(event)\n    return process(event, retries=3)\n"
    generated = "\n\n".join([block] * 12)
    assert first_drop(quality_filters("code"), generated) == ("CodeRepetitionFilter", "dup_para_frac")
    assert first_drop(quality_filters("code"), "from .core import main\n") == (
        "CodeLengthFilter", "gopher_short_doc")



@pytest.mark.parametrize("domain", ["prose", "latex", "code"])
def test_windows_line_endings_get_the_verdicts_of_unix_ones(domain):
    """A text read as written with `\\r\\n` (Project Gutenberg's books, a Windows source file):
    each blank line split off a line `\\r`, so one-line paragraphs were dropped as duplicate
    lines, and no text had two paragraphs, so repeated blocks were never caught."""
    dialogue = "\n\n".join(PROSE.split("\n") + [
        "Is the museum open on Sundays, she asked the guard at the gate.",
        "He told her that it opens at ten and closes early in the winter months.",
        "They walked along the marked trail until the light began to fade."])
    block = "def handler(event):\n    log(event)\n    return process(event, retries=3)\n"
    generated = "\n\n".join([block] * 12)
    for text in (dialogue, generated, PROSE, CODE):
        windows = text.replace("\n", "\r\n")
        assert first_drop(quality_filters(domain), windows) == first_drop(
            quality_filters(domain), text), text[:30]
    assert first_drop(quality_filters(domain), dialogue.replace("\n", "\r\n")) is None
    assert first_drop(quality_filters(domain), generated.replace("\n", "\r\n")) is not None
    doc = Document(text=dialogue.replace("\n", "\r\n"), id="d")
    quality_filters(domain)[1].filter(doc)  # the repetition rules leave the text as written
    assert doc.text == dialogue.replace("\n", "\r\n")

REPEATS = [
    "\n\n".join(["def f(x):\n    return x + 1\n"] * 4 + ["class A:\n    pass\n"] * 6),
    "\n".join(["x = 1"] * 20 + [f"y{i} = {i}" for i in range(8)]),
    "\n\n".join([f"block {i}\n" + "same line\n" * 3 for i in range(9)]),
    "\n\n".join(["a" * 400] + [f"b{i}" for i in range(9)] + ["a" * 400]),
    "\n".join(["z" * 300] + [f"c{i}" for i in range(10)] + ["z" * 300]),
    CODE,
    PROSE,
]


@pytest.mark.parametrize("rules", [
    {},  # the code domain's: paragraph rules only
    {"dup_line_frac": 0.3, "dup_line_char_frac": 0.2},  # Gopher's line rules too
])
def test_code_repetition_equals_gopher_repetition_without_ngrams(rules):
    """Same verdicts and reasons as datatrove's filter with the same rules, on documents
    that trip each rule and on clean ones."""
    ours = CodeRepetitionFilter(**rules)
    gopher = GopherRepetitionFilter(**{"dup_line_frac": None, "dup_line_char_frac": None,
                                       **rules, "top_n_grams": (), "dup_n_grams": ()})
    verdicts = []
    for text in REPEATS + [""]:
        got = get_filter_result(ours.filter(Document(text, "r")))
        assert got == get_filter_result(gopher.filter(Document(text, "r"))), text[:40]
        verdicts.append(got[1])
    assert "dup_para_frac" in verdicts and None in verdicts and "empty" in verdicts
    assert "dup_para_char_frac" in verdicts
    if rules:
        assert "dup_line_frac" in verdicts and "dup_line_char_frac" in verdicts


def test_code_length_counts_word_runs():
    f = CodeLengthFilter(min_words=3, max_words=5)
    assert get_filter_result(f.filter(Document("x = f(a_b)", "a"))) == (True, None)  # x f a_b
    assert get_filter_result(f.filter(Document("(x) + {}", "b"))) == (False, "gopher_short_doc")
    assert get_filter_result(f.filter(Document("a b c d e f", "c"))) == (False, "gopher_long_doc")
    unbounded = CodeLengthFilter(min_words=None, max_words=None)
    assert get_filter_result(unbounded.filter(Document("", "d"))) == (True, None)


def test_unknown_domain_is_a_clear_error():
    with pytest.raises(ValueError, match="prose, latex, code"):
        quality_filters("html")


def test_exclusion_writer_factory_is_called_per_filter():
    names = []

    def factory(name):
        names.append(name)
        return None

    for domain, n in (("prose", 5), ("latex", 4), ("code", 3)):
        names.clear()
        steps = quality_filters(domain, exclusion_writer=factory)
        assert len(names) == len(steps) == n and len(set(names)) == n, domain


def test_code_length_bounds_are_50_to_100_000_words():
    """The code domain's Gopher-style length bounds, pinned at both edges."""
    [length] = [f for f in quality_filters("code") if isinstance(f, CodeLengthFilter)]

    def kept(n: int):
        return length.filter(Document(text=" ".join(f"w{i}" for i in range(n)), id="d"))

    assert kept(49) == (False, "gopher_short_doc") and kept(50) is True
    assert kept(100_000) is True and kept(100_001) == (False, "gopher_long_doc")


def test_prose_c4_is_fineweb_s_without_the_terminal_punctuation_rule():
    """FineWeb ran C4QualityFilter(filter_no_terminal_punct=False) (datatrove's
    examples/fineweb.py; the paper: the rule removed too many tokens). With C4's default the
    prose domain deleted every line of a hard-wrapped paragraph but its last (here 9 of 14
    lines); now only lines of under 3 words go."""
    import textwrap

    wrapped = "\n".join(textwrap.fill(line, 60) for line in PROSE.splitlines())
    c4 = only(quality_filters("prose"), C4QualityFilter)
    assert c4.filter_no_terminal_punct is False
    assert c4.min_words_per_line == 3 and c4.filter_javascript and c4.filter_curly_bracket
    doc = Document(text=wrapped, id="w")
    for step in quality_filters("prose"):
        assert get_filter_result(step.filter(doc)) == (True, None), type(step).__name__
    assert doc.text == "\n".join(line for line in wrapped.splitlines() if len(line.split()) >= 3)
    assert len(doc.text) > 0.95 * len(wrapped)


def test_latex_keeps_the_indentation_of_code_blocks():
    """The LaTeX converter writes a verbatim/listing as a ``` block exactly as written; the
    latex domain's C4 stripped every line, so a Python listing lost its indentation."""
    listing = "```\ndef f(x):\n    if x:\n        return 1\n    return 2\n```"
    text = LATEX + "\n\n" + listing + "\n"
    doc = Document(text=text, id="l")
    for step in quality_filters("latex"):
        assert get_filter_result(step.filter(doc)) == (True, None), type(step).__name__
    assert doc.text == text
    # C4's long-word line rule still removes a line, and only that line
    blob = "data:" + "A" * 1200
    doc = Document(text=LATEX + "\n" + blob + "\n  indented", id="b")
    assert only(quality_filters("latex"), C4QualityFilter).filter(doc) is True
    assert doc.text == LATEX + "\n  indented"


@pytest.mark.parametrize("sep", ["\r", "\f", "\r\n"])
def test_latex_long_word_rule_removes_c4_s_line_not_the_text(sep):
    """C4 splits lines at every line break (`splitlines`: a lone \\r, a form feed); the
    latex domain's rewrite split at \\n alone, so a text with other breaks was one line: a
    long word anywhere emptied the document C4 had kept."""
    lines = LATEX.split("\n")
    blob = "data:" + "A" * 1200
    doc = Document(text=sep.join([*lines, blob, "  indented"]), id="r")
    assert only(quality_filters("latex"), C4QualityFilter).filter(doc) is True
    assert doc.text == sep.join([*lines, "  indented"])
