"""Dating documents (arXiv ids, Gutenberg headers, metadata, Chronoberg vote) and period filter."""

import pytest
from datatrove.data import Document

from kiln.data.dating import (
    CHRONOBERG_PERIODS,
    DateDocuments,
    PeriodFilter,
    arxiv_year,
    date_document,
    in_lifetime,
    majority_vote,
    parse_gutenberg_header,
)


def dated(text="", doc_id="x", **metadata):
    (doc,) = DateDocuments().run(iter([Document(text=text, id=doc_id, metadata=metadata)]))
    return doc.metadata


@pytest.mark.parametrize(
    "ident, year",
    [
        ("2101.01234v2", 2021),
        ("arxiv/src/1501.00001.tar.gz", 2015),
        ("0704.0001", 2007),  # first new-style id
        ("1412.9999", 2014),  # last 4-digit id
        ("hep-th/9901001", 1999),
        ("math.AG/0309136", 2003),
        ("cond-mat/0703123v1", 2007),  # last month of the old scheme
        ("astro-ph/9204001", 1992),
        ("1913.01234", None),  # month 13
        ("0612.1234", None),  # new style did not exist before 2007-04
        ("1501.1234", None),  # 2015 on needs 5 digits
        ("hep-th/0801001", None),  # old style ended 2007-03
        ("report 12345", None),
    ],
)
def test_arxiv_ids(ident, year):
    assert arxiv_year(ident) == year


def test_arxiv_from_doc_id_and_metadata():
    md = dated("Some LaTeX body written 1999.", doc_id="2303.12345")
    assert (md["year"], md["year_method"]) == (2023, "arxiv")
    md = dated("body", arxiv_id="quant-ph/9705052")
    assert (md["year"], md["year_method"]) == (1997, "arxiv")


def test_a_numbered_file_path_is_not_an_arxiv_id():
    """Kiln's ids and `source` for files are paths: `books/0001023.txt` once read as the
    old-style id books/0001023 (January 2000) and outranked the book's own header."""
    text = "Title: Bleak House\nAuthor: Charles Dickens (1812-1870)\nOriginal publication: 1853\n"
    for path in ("books/0001023.txt", "data/9501234.txt:7"):
        md = dated(text, doc_id=path, source=path)
        assert (md["year"], md["year_method"]) == (1853, "majority_vote")
    # a record's own fields and an id that is itself an arXiv identifier still count
    assert dated("x", doc_id="data.jsonl:3", record_source="arxiv.org/abs/hep-th/9901001")["year"] == 1999
    assert dated("x", doc_id="hep-th/9901001v2")["year"] == 1999
    assert "year" not in dated("x", doc_id="papers/2303.12345.txt")  # a path, not an id


@pytest.mark.parametrize("text", ["I wrote 2500 words of my novel today.",
                                  "The factory created 1200 jobs last spring.",
                                  "Title: 1001 Arabian Nights\nA tale."])
def test_numbers_that_cannot_be_years_date_nothing_without_a_lifetime(text):
    """With no author lifetime, a count after 'wrote' or in a title is not a year: outside
    1450..this year it is no candidate, and the document stays undated (so a period filter
    with keep_undated keeps it)."""
    md = dated(text)
    assert "year" not in md and md["year_candidates"] == {}
    (doc,) = DateDocuments().run(iter([Document(text=text, id="x")]))
    assert PeriodFilter(["1950-2000"], keep_undated=True).filter(doc) is True


def test_metadata_year_and_date_fields_win():
    assert dated("x", doc_id="2101.01234", year=1888)["year"] == 1888
    md = dated("x", date="1923-05-01T00:00:00")
    assert (md["year"], md["year_method"]) == (1923, "metadata")
    assert dated("x", year="1850")["year"] == 1850


def test_years_of_a_pandas_made_catalogue_are_read():
    """A pandas column with a missing value is float, so a catalogue exported from one holds
    1850.0 (or "1850.0"): such a year was no year, the book undated and dropped by `period`,
    and such a lifetime unknown, so a candidate after the author's death was kept."""
    assert dated("x", year=1850.0)["year"] == dated("x", year="1850.0")["year"] == 1850
    assert PeriodFilter(["1850-1899"]).filter(Document(text="x", id="b", metadata={"year": 1850.0}))
    md = dated("no dates", title="Essays", open_library_years=[1900.0, 1900.0, 1850.0],
               author_birth_year=1800.0, author_death_year=1870.0)
    assert (md["year"], md["author_death_year"]) == (1850, 1870)  # 1900: after the death
    assert "year_method" not in dated("x", year=float("nan"))  # NaN: no year, left undated


@pytest.mark.parametrize("placeholder", [{"year": 0}, {"year": "0000"}, {"year": -1},
                                         {"year": 9999}, {"date": "0000-00-00 00:00:00"}])
def test_a_placeholder_year_is_no_year(placeholder):
    """A catalogue's "unknown" (year 0, MySQL's zero date, 9999) dated the document to it:
    the year method said `metadata`, other evidence was never read, and `period` dropped it
    as out of period even with keep_undated."""
    md = dated("A tale written in 1850 by the sea.", **placeholder)
    assert md.get("year_method") != "metadata" and md.get("year") == 1850  # from its text
    doc = Document(text="No dates here.", id="u", metadata=dict(placeholder))
    doc.metadata.update(date_document(doc))
    assert "year_method" not in doc.metadata
    assert PeriodFilter(["1850-1899"], keep_undated=True).filter(doc) is True
    assert PeriodFilter(["1850-1899"]).filter(doc) == (False, "undated")


def test_an_author_of_before_the_common_era_keeps_his_life():
    """Gutendex gives a BCE author's years as negative (Homer -750..-650): read as
    placeholders, his life was unknown and a translation's modern years dated the epic to
    the 1890s; they bound the candidates, so none passes and the document stays undated."""
    md = dated("The wrath of Achilles. This translation was published in 1898.",
               author_birth_year=-750, author_death_year=-650, open_library_years=[1898])
    assert "year" not in md
    assert (md["author_birth_year"], md["author_death_year"]) == (-750, -650)
    placeholder = dated("x", author_birth_year=0, author_death_year=0, open_library_years=[1898])
    assert placeholder["year"] == 1898  # 0 is still "unknown": no life to keep the year out


GUTENBERG = """The Project Gutenberg EBook of Essays 1848, by Jane Doe

Title: Essays 1848
Author: Jane Doe (1800-1870)
Release Date: March 3, 2004 [EBook #11400]
Posting Date: May 1, 2009
Original publication: London: Smith, Elder, 1850

*** START OF THIS PROJECT GUTENBERG EBOOK ***
Chapter I. These essays were written in 1850 at the seaside.
"""


def test_gutenberg_header_parsed_and_release_date_not_used():
    header = parse_gutenberg_header(GUTENBERG)
    assert header == {
        "title": "Essays 1848",
        "author": "Jane Doe (1800-1870)",
        "birth": 1800,
        "death": 1870,
        "release_year": 2004,
        "original_year": 1850,
    }
    md = dated(GUTENBERG)
    # title 1848, original publication 1850, text 1850 -> majority 1850; release 2004 ignored
    assert md["year_candidates"] == {"original_publication": 1850, "title": 1848, "text": 1850}
    assert (md["year"], md["year_method"]) == (1850, "majority_vote")
    assert md["gutenberg_release_year"] == 2004
    assert (md["author_birth_year"], md["author_death_year"]) == (1800, 1870)


def test_the_first_original_publication_line_counts():
    """Every header field is its first line's, but a later "Original publication:" line (a
    reprint's, in the text read with the header) replaced the header's year."""
    text = GUTENBERG + "Original publication: Boston, 1901 (a reprint)\n"
    assert parse_gutenberg_header(text)["original_year"] == 1850


def test_digest_record_wikipedia_openlibrary_title():
    """Digest check: title "Essays 1848", Wikipedia 1850, Open Library 1850, author 1800-1870."""
    md = dated(
        "no dates in this body",
        title="Essays 1848",
        wikipedia_summary="Essays is a collection by Jane Doe first issued in 1850.\nLater 1900.",
        open_library_years=[1850, 1850, 1900, 1849],
        author_birth_year=1800,
        author_death_year=1870,
    )
    assert md["year_candidates"] == {"wikipedia": 1850, "open_library": 1850, "title": 1848}
    assert md["year"] == 1850


def test_majority_vote_ignores_years_outside_lifetime():
    """Years after the author's death (1870) dominate the text but must be discarded."""
    text = (
        "Author: Ann Roe (1812-1870)\n\n"
        "This edition was published in 1900.\nReprinted and published in 1900.\n"
        "A translation was published in 1905.\nThe first draft was written in 1840.\n"
        "She wrote the preface in 1840.\nA second volume was published in 1855.\n"
    )
    md = dated(text)
    assert md["year_candidates"] == {"text": 1840}
    assert md["year"] == 1840
    # without a known lifetime the out-of-life years win the mode
    assert date_document(Document(text=text.split("\n", 1)[1], id="y"))["year"] == 1900


def test_lifetime_rule():
    assert in_lifetime(1850, 1800, 1870) and in_lifetime(1870, 1800, 1870)
    assert not in_lifetime(1800, 1800, 1870)  # birth < year
    assert not in_lifetime(1900, 1800, 1870)
    assert not in_lifetime(1820, 1700, None)  # digest: unknown death, > 100 years after birth
    assert in_lifetime(1790, 1700, None)
    assert in_lifetime(1500, None, None)
    assert not in_lifetime(1200, None, None)  # no lifetime: 1450 .. this year
    assert not in_lifetime(9999, None, None) and not in_lifetime(2990, 1950, None)


def test_the_100_year_rule_judges_the_voted_label_not_each_candidate():
    """Chronoberg checks each candidate against birth < year <= death only (no death year: no
    upper bound), votes, then leaves out a book whose label is over 100 years after a birth
    with no death year. Birth 1700, death unknown: Wikipedia 1820 and Open Library 1820 against
    the title's 1750 -> the vote is 1820 (2 of 3), 1820 - 1700 = 120 > 100 -> undated; it must
    not fall back to the minority 1750."""
    md = dated("no dates in this body", title="Tales 1750",
               wikipedia_summary="Tales is a book first issued in 1820.",
               open_library_years=[1820], author_birth_year=1700)
    assert md["year_candidates"] == {"wikipedia": 1820, "open_library": 1820, "title": 1750}
    assert "year" not in md and md["year_rejected"] == 1820
    # a label within 100 years is kept, and an over-100 candidate still counts in the vote
    md = dated("no dates in this body", title="Tales 1790",
               wikipedia_summary="Tales is a book first issued in 1790.",
               open_library_years=[1850], author_birth_year=1700)
    assert md["year_candidates"] == {"wikipedia": 1790, "open_library": 1850, "title": 1790}
    assert (md["year"], md["year_method"]) == (1790, "majority_vote")
    assert "year_rejected" not in md


def test_vote_tie_breaks_by_source_order():
    # 1-1 tie: Wikipedia beats Open Library (as in the released Chronoberg catalogue)
    assert majority_vote({"open_library": 1962, "wikipedia": 1961}) == 1961
    # 1-1-1 tie: the earliest source in the order wins
    assert majority_vote({"title": 1787, "open_library": 2011, "wikipedia": 1789}) == 1789
    # a real majority beats source order
    assert majority_vote({"wikipedia": 1789, "title": 1787, "text": 1787}) == 1787
    assert majority_vote({}) is None


def test_undated_document():
    md = dated("nothing to see here")
    assert "year" not in md and md["year_candidates"] == {}


def test_period_filter_with_names_and_ranges():
    years = [1760, 1801, 1849, 1850, 1949, 2000, None]
    docs = [Document(text="t", id=str(y), metadata={} if y is None else {"year": y}) for y in years]
    flt = PeriodFilter(["1800-1849", (1990, 2005)])
    kept = [d.id for d in flt.run(iter(docs))]
    assert kept == ["1801", "1849", "2000"]
    assert flt.stats["dropped_undated"].total == 1
    assert flt.stats["dropped_out_of_period"].total == 3
    kept = [d.id for d in PeriodFilter([(1750, 1760)], keep_undated=True).run(iter(docs))]
    assert kept == ["1760", "None"]
    with pytest.raises(ValueError, match="unknown period"):
        PeriodFilter(["1700s"])
    with pytest.raises(ValueError, match="starts after"):
        PeriodFilter([(1900, 1800)])


def test_chronoberg_buckets_cover_1750_2000_without_gaps():
    spans = sorted(CHRONOBERG_PERIODS.values())
    assert spans[0][0] == 1750 and spans[-1][1] == 2000
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    assert all(name == f"{a}-{b}" for name, (a, b) in CHRONOBERG_PERIODS.items())


@pytest.mark.parametrize("where", ["header", "translators", "translator"])
def test_a_translated_book_is_left_undated(where):
    """Digest check (Chronoberg's "no translator" filter): a translated book is rejected. Its
    vote would give the original's year, while its words are the translator's; it is left
    undated, so a period filter leaves it out, and counted by reason."""
    header = GUTENBERG.replace("Author: Jane Doe (1800-1870)\n",
                               "Author: Jane Doe (1800-1870)\nTranslator: Ann Roe\n")
    text, md = (header, {}) if where == "header" else (GUTENBERG, {
        where: ["Ann Roe"] if where == "translators" else "Ann Roe"})
    doc = Document(text=text, id="b", metadata=md)
    step = DateDocuments()
    (out,) = step.run(iter([doc]))
    assert "year" not in out.metadata
    assert (out.metadata["year_rejected"], out.metadata["year_rejected_reason"]) == (1850, "translated")
    assert step.stats["undated/translated"].total == 1
    assert PeriodFilter(["1850-1899"]).filter(out) == (False, "undated")
    untranslated = dated(GUTENBERG, translators=[], translator="")
    assert untranslated["year"] == 1850  # an empty field names no translator


@pytest.mark.parametrize("translator", ["", "Translator: Ann Roe\n"])
def test_the_parts_of_a_cut_text_are_dated_as_its_first_part(translator):
    """`read` cuts a text over 1,000,000 characters into parts (part_of: the text's id); only
    the first holds the Gutenberg header. Dated alone, a translated book's later part was
    dated by the year its text names (1869, kept by a period filter), and an untranslated
    one's had no evidence (undated, dropped): the whole book is one year, or none."""
    header = GUTENBERG.replace("Author: Jane Doe (1800-1870)\n",
                               f"Author: Jane Doe (1800-1870)\n{translator}")
    parts = [Document(text=t, id=f"b.txt#{k}", metadata={"part_of": "b.txt"})
             for k, t in enumerate([header, "More essays.\n", "Epilogue, written in 1869.\n"], 1)]
    other = Document(text="Notes, written in 1869.\n", id="c.txt#1", metadata={"part_of": "c.txt"})
    step = DateDocuments()
    between = Document(text="Problem: 2 + 2?", id="replica-0-0")  # inject_replicas' place
    out = [d.metadata for d in step.run(iter([*parts[:2], between, parts[2], other]))]
    book, alone = [out[0], out[1], out[3]], out[4]
    want = ({"year_rejected": 1850, "year_rejected_reason": "translated"} if translator
            else {"year": 1850, "year_method": "majority_vote"})
    for md in book:
        assert {k: md.get(k) for k in want} == want and ("year" in md) == (not translator)
        assert md["year_candidates"] == book[0]["year_candidates"]
    assert alone["year"] == 1869  # another text: dated by its own evidence
    assert step.stats["undated/translated" if translator else "dated/majority_vote"].total >= 3


def test_verb_years_are_the_rules_matches_in_linear_time():
    """The "text" source's regex ran from each verb to the next digit of its line: a long
    line with many verbs and no digit (a text with no line breaks) was quadratic (144,000
    characters: 19 s a document). The same years, found in linear time."""
    import random

    from linear_time import assert_linear

    from kiln.data.dating import _VERB_YEAR, _verb_years

    rng = random.Random(3)
    atoms = ["written", "Published", "wrote", "created", " in ", "1850", "12", "18500", "١٨٥٠",
             "\n", ", ", "x", "2001", "writtenwrote"]
    for _ in range(20_000):
        text = "".join(rng.choices(atoms, k=rng.randint(0, 14)))
        want = [int(y) for line in text.split("\n") for y in _VERB_YEAR.findall(line)]
        assert _verb_years(text) == want, text
    assert_linear(_verb_years, lambda n: "it was written so " * n, 500)
