"""The `language` prepare stage: langdetect, seeded, judged without math (arXiv digest)."""

import re
import subprocess
import sys

import pytest
from datatrove.data import Document

from kiln.config import load_config
from kiln.data.filters.language import LanguageFilter, detect_language, profile_languages, prose
from kiln.data.prepare_config import LANGUAGES
from kiln.errors import ConfigError

EN = ("We study the distribution of primes in short intervals and prove a new bound on the gaps "
      "between consecutive primes.")
DE = ("Wir untersuchen die Verteilung der Primzahlen in kurzen Intervallen und beweisen eine "
      "neue Abschätzung für die Lücken zwischen aufeinanderfolgenden Primzahlen.")
FR = ("Nous étudions la répartition des nombres premiers dans les intervalles courts et nous "
      "démontrons une nouvelle borne pour les écarts entre nombres premiers consécutifs.")
MATH = [r"$\alpha_{ij}^{k}$", r"$\sum_{n=1}^\infty a_n$",
        r"\begin{align} x &= \frac{\partial u}{\partial t} + \Delta u \\ y &= \sin(\theta) "
        r"\end{align}", r"$\mathcal{O}(n \log n)$", r"$\lim_{t\to 0} \phi_t(x) = \psi$",
        r"\[ \det(A - \lambda I) = 0 \]", r"$\tan\vartheta = \cos\varphi$"]
# six English words among formulas: langdetect on the raw text says Catalan (the digest's warning)
MATH_HEAVY = "Hence the estimate holds for every " + " ".join(
    MATH[i] for i in (2, 6, 0, 6, 0, 0, 4, 5, 0, 4, 2, 5, 6, 5, 5))


@pytest.mark.parametrize("text, lang", [(EN, "en"), (DE, "de"), (FR, "fr")])
def test_prose_is_detected(text, lang):
    got, prob = detect_language(text)
    assert got == lang and prob > 0.9


def test_math_is_not_read_as_a_language():
    assert detect_language(MATH_HEAVY, strip_math=False)[0] != "en"  # the digest's rule fails
    assert detect_language(MATH_HEAVY)[0] == "en"
    assert "\\" not in prose(MATH_HEAVY) and "$" not in prose(MATH_HEAVY)
    assert detect_language(r"$x^2 + y^2 = z^2$ \[ \int_0^1 f \]") == ("und", 0.0)
    assert detect_language("") == ("und", 0.0)


def test_the_answer_is_the_same_in_every_process():
    """langdetect samples at random: unseeded, short mixed texts flip between runs."""
    mixed = "Der Beweis folgt. The proof follows. La preuve suit."
    here = [detect_language(mixed) for _ in range(20)]
    assert len(set(here)) == 1
    code = ("from kiln.data.filters.language import detect_language; "
            f"print(detect_language({mixed!r}))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == repr(here[0])


def _run(filt: LanguageFilter, texts: list[str]) -> list[Document]:
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    return list(filt.run(iter(docs)))


def test_drop_keeps_the_languages_asked_for_and_counts_why():
    filt = LanguageFilter(["en", "fr"])
    kept = _run(filt, [EN, DE, FR, "$x$", MATH_HEAVY])
    assert [d.id for d in kept] == ["0", "2", "4"]
    assert [d.metadata["language"] for d in kept] == ["en", "fr", "en"]
    assert all(0.5 < d.metadata["language_score"] <= 1 for d in kept)
    stats = filt.stats.to_dict()["stats"]
    assert stats["dropped_other_language"] == 1 and stats["dropped_undetermined_language"] == 1
    assert stats["language/en"] == 2 and stats["language/de"] == 1


def test_tag_keeps_every_document():
    kept = _run(LanguageFilter(["en"], mode="tag"), [EN, DE, ""])
    assert [d.metadata["language"] for d in kept] == ["en", "de", "und"]


def test_the_light_copy_of_the_language_codes_matches_langdetect():
    assert LANGUAGES == profile_languages()


@pytest.mark.parametrize("override, message", [
    ('prepare.language.languages=["english"]', "prepare.language.languages: 'english'"),
    ('prepare.language.languages=["EN"]', "(did you mean 'en'?)"),
    ('prepare.language.mode="keep"', "prepare.language.mode: 'keep'"),
    ("prepare.language.languages=[]", "prepare.language.languages is empty"),
])
def test_bad_language_settings_are_refused_at_load(override, message):
    stages = 'prepare.stages=["read", "language", "write"]'
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [stages, override])


def test_tag_mode_needs_no_languages():
    cfg = load_config(None, ['prepare.stages=["read", "language", "write"]',
                             'prepare.language.mode="tag"', "prepare.language.languages=[]"])
    assert cfg.prepare.language.mode == "tag"


@pytest.mark.parametrize("unit", ['re.compile(r"a\\(b") x ', "see \\[ note ",
                                  "\\begin{align} x ", "cost $5\n \n"])
def test_math_stripping_is_linear_in_the_text(unit):
    """MATH_SPAN's lazy `.+?` ran to the end of the text for every opener with no closer
    after it: 100,000 characters of regex source (`\\(`) or an unclosed `\\[` / `\\begin{align}`
    took 1.5-3.5 s a document (the stage's budget is ~20 ms). The same spans, linear now."""
    from linear_time import assert_linear

    assert_linear(prose, lambda n: (unit * n)[: n * 16], 1_000, what=unit)


def test_math_stripping_replaces_the_spans_the_regex_does():
    import random

    from kiln.data.arxiv.markup_metrics import _ALTS, MATH_SPAN, strip_math_spans

    assert "|".join(_ALTS) == MATH_SPAN.pattern  # the alternatives are the regex's own
    rng = random.Random(5)
    atoms = ["$", "$$", "\\", "\\(", "\\)", "\\[", "\\]", "\\$", "{", "}", "a", " ", "\n", "é",
             "\\begin{align}", "\\end{align}", "\\begin{align*}", "\\end{align*}",
             "\\begin{equation}", "\\end{equation}", "\\begin{foo}", "\\end{foo}"]
    for _ in range(20_000):
        text = "".join(rng.choices(atoms, k=rng.randint(0, 25)))
        assert strip_math_spans(text) == MATH_SPAN.sub(" ", text), text
    for text in (MATH_HEAVY, *MATH, EN):
        assert strip_math_spans(text) == MATH_SPAN.sub(" ", text)


def test_an_inline_math_span_stays_in_its_paragraph():
    """TeX allows no blank line inside `$..$`, but the span regex ran from one `$` to the next
    across paragraphs: an English page with two prices was judged on "Save 40" (Croatian,
    dropped), and the latex stage writes `\\$` as `$`, so a paper lost the prose between.
    Display math still spans a blank line: the converter leaves one where a `\\label` was."""
    page = "Save $5 now!\n\n" + (EN + "\n\n") * 8 + "Total: $40\n"
    assert EN in prose(page) and detect_language(page)[0] == "en"
    paper = ("The grant was $5 million.\r\n\r\n" + EN + "\r\n\r\nLater it was $10 million."
             "\r\n\r\nHence $x^2$ holds, and \\begin{equation}\n  \n  2\\times2=4\n\\end{equation}")
    assert EN in prose(paper) and not re.search(r"x\^2|times|2=4|equation", prose(paper))
    assert _run(LanguageFilter(["en"]), [page])[0].metadata["language"] == "en"


def test_in_paragraph_stripping_replaces_the_spans_its_regex_does():
    import random

    from kiln.data.arxiv.markup_metrics import _ALTS, _DOLLAR_IN_PARAGRAPH, strip_math_spans

    in_paragraph = re.compile("|".join((_ALTS[0], _DOLLAR_IN_PARAGRAPH.pattern, *_ALTS[2:])), re.S)
    rng = random.Random(6)
    atoms = ["$", "$$", "\\", "\\(", "\\)", "\\[", "\\]", "\\$", "a", " ", "\n", "\n\n", "\n \t\n",
             "\r\n\r\n", "\\begin{align}", "\\end{align}"]
    for _ in range(20_000):
        text = "".join(rng.choices(atoms, k=rng.randint(0, 25)))
        assert strip_math_spans(text, inline_in_paragraph=True) == in_paragraph.sub(" ", text), text


def test_the_parts_of_a_cut_text_take_its_first_parts_language():
    """The reader cuts a text over 1,000,000 characters into parts (`part_of`): a part that is
    a table of figures was judged alone, undetermined, and dropped from a kept English book.
    Every part takes the language of its text's first part; another text is judged anew."""
    from kiln.data.long_documents import PART_OF

    table = "\n".join(f"{i} | {i * i} | {i ** 3}" for i in range(200))
    book = [Document(text=t, id=f"book#{i + 1}", metadata={PART_OF: "book"})
            for i, t in enumerate((EN, table, EN))]
    other = Document(text=DE, id="next#1", metadata={PART_OF: "next"})
    flt = LanguageFilter(["en"])
    assert [flt.filter(d) for d in book] == [True, True, True]
    assert {d.metadata["language"] for d in book} == {"en"}
    assert flt.filter(other) == (False, "other_language")
    assert detect_language(table) == ("und", 0.0)  # what the table alone is judged


def test_two_sources_named_alike_are_two_texts_for_the_first_parts_verdict(tmp_path):
    """`part_of` is a text's id within its source: `en/dump.txt` and `de/dump.txt`, given as
    files, both cut by the reader, both give `part_of = "dump.txt"`. Read one after the other,
    the German text's parts took the English text's language and were kept as English (and
    its M2 verdict and perplexity score likewise): a text is its source and its id."""
    from kiln.data.documents import SourceReader
    from kiln.data.filters.junk_heuristics import HeuristicJudge
    from kiln.data.filters.semantic import SemanticQualityFilter

    paths = []
    for lang, text in (("en", EN), ("de", DE)):
        (tmp_path / lang).mkdir()
        paths.append(tmp_path / lang / "dump.txt")
        paths[-1].write_text((text + "\n\n") * (1_100_000 // len(text) + 1))
    docs = list(SourceReader([str(p) for p in paths], progress=False).run())
    assert {d.metadata["part_of"] for d in docs} == {"dump.txt"} and len(docs) == 4
    flt = LanguageFilter(["en"])
    assert [flt.filter(d) for d in docs] == [True, True, (False, "other_language"),
                                              (False, "other_language")]
    assert [d.metadata["language"] for d in docs] == ["en", "en", "de", "de"]
    m2 = SemanticQualityFilter(HeuristicJudge())
    for d in docs:
        m2.filter(d)
    assert m2.stats["m2_judged"].total == 2  # one verdict a text


SHORT = ["Hello", "OK", "x = 1", "Table 3: results (n = 12)", "id,value\n1,2\n3,4\n5,6",
         "def f(x):\n    return x + 1\n", "https://example.com/a/longer/path/to/a/page.html"]


def test_too_few_letters_to_judge_is_undetermined_not_a_guess():
    """On a few words langdetect guessed: "Hello" Finnish, "OK" Portuguese, "x = 1" Somali, a
    CSV Estonian, a line of code Danish; dropped as `other_language` from an English corpus,
    tagged with a wrong language. Under MIN_LETTERS letters (URLs, digits, math not counted)
    a text is `und`, as one with no letters was; normal-length texts are judged as before."""
    assert [detect_language(t) for t in SHORT] == [("und", 0.0)] * len(SHORT)
    from kiln.data.filters.language import MIN_LETTERS

    assert all(len(re.findall(r"[^\W\d_]", t)) < MIN_LETTERS for t in SHORT[:-1])
    assert detect_language("Thank you very much, friend")[0] == "en"  # 22 letters: judged
    filt = LanguageFilter(["en"])
    kept = _run(filt, [EN, DE, *SHORT, FR])
    assert [d.id for d in kept] == ["0"]
    stats = filt.stats.to_dict()["stats"]
    assert stats["dropped_undetermined_language"] == len(SHORT)
    assert stats["dropped_other_language"] == 2 and stats["language/und"] == len(SHORT)
    tagged = _run(LanguageFilter(["en"], mode="tag"), [EN, DE, FR, *SHORT])
    assert [d.metadata["language"] for d in tagged] == ["en", "de", "fr"] + ["und"] * len(SHORT)


def test_the_prepare_summary_counts_the_undetermined(tmp_path):
    import json

    from kiln.data.pipeline import run_prepare
    from kiln.data.prepare_config import PrepareConfig

    src = tmp_path / "src"
    src.mkdir()
    (src / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                            for t in [EN, DE, *SHORT]))
    run_prepare(PrepareConfig(stages=["read", "language", "write"]), tmp_path / "run", [str(src)],
                progress=False)
    rows = {r["stage"]: r for r in json.loads((tmp_path / "run/yield.json").read_text())["stages"]}
    assert rows["language"]["drop_reasons"] == {"other_language": 1,
                                                "undetermined_language": len(SHORT)}


def test_a_short_cjk_sentence_is_judged_not_undetermined():
    """MIN_LETTERS was measured on English's alphabet; counted one a letter, a Japanese,
    Korean or Chinese sentence of 10-16 characters (which langdetect reads right) was 'und'
    and dropped from a corpus wanting that language. A Han, kana or Hangul character weighs
    DENSE_LETTERS now; a word or two of them is still too little."""
    assert detect_language("今日はとても良い天気ですね。")[0] == "ja"
    assert detect_language("오늘 날씨가 정말 좋네요")[0] == "ko"
    assert detect_language("今天天气很好，我们去公园散步吧。")[0] == "zh-cn"
    assert detect_language("你好") == ("und", 0.0)
    assert detect_language("表2 结果") == ("und", 0.0)  # 'ko' by a guess before the rule
    kept = _run(LanguageFilter(["ja"]), ["今日はとても良い天気ですね。", "Hello"])
    assert [d.metadata["language"] for d in kept] == ["ja"]
