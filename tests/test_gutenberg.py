"""Project Gutenberg header/footer stripping (Chronoberg cleaning) and its hand-off to dating."""

from __future__ import annotations

import pytest
from datatrove.data import Document

from kiln.config import load_config
from kiln.data.dating import date_document
from kiln.data.documents import read_documents
from kiln.data.gutenberg import GutenbergStripper, strip_gutenberg
from kiln.data.pipeline import run_prepare

HEADER = """\ufeffThe Project Gutenberg EBook of Essays 1848, by Jane Doe

This eBook is for the use of anyone anywhere at no cost and with
almost no restrictions whatsoever.

Title: Essays 1848
Author: Jane Doe (1800-1870)
Release Date: March 3, 2004 [EBook #11400]
Original publication: London: Smith, Elder, 1850

*** START OF THIS PROJECT GUTENBERG EBOOK ESSAYS 1848 ***




Produced by Anne Smith and the Online Distributed
Proofreading Team at http://www.pgdp.net


"""
BODY = ("CHAPTER I.\n\nThese essays were written in 1850 at the seaside.\n\n"
        + "".join(f"Line {i} of the essays, which go on.\n" for i in range(150)))
FOOTER = """

End of the Project Gutenberg EBook of Essays 1848, by Jane Doe

*** END OF THIS PROJECT GUTENBERG EBOOK ESSAYS 1848 ***

Updated editions will replace the previous one. This file was created
in 2009 from the edition published 2004, and the licence written 2011.
"""
BOOK = HEADER + BODY + FOOTER


def test_header_and_footer_go_and_only_the_body_is_left():
    """Digest check: a file with PG header, body and footer keeps only the body."""
    out = strip_gutenberg(BOOK)
    assert out.found and out.body == BODY.rstrip()
    assert "Produced by" not in out.body and "Project Gutenberg" not in out.body
    assert out.header.startswith("\ufeffThe Project Gutenberg EBook") and "Title: Essays" in out.header


def test_a_short_book_loses_its_footer_too():
    """The footer counts from the start marker on, however short the body (the reference's
    100-line guard holds only for a text without a start marker)."""
    book = HEADER + "A short poem.\n" + FOOTER
    assert strip_gutenberg(book).body == "A short poem."



def test_a_short_book_with_the_small_print_after_its_footer_keeps_its_body():
    """Books of ~2002 end with the small print ("*END THE SMALL PRINT!...", a start marker of
    the 1990s header) after the end marker; in a book under 600 lines it was taken as the last
    start marker and the whole body went (`gutenberg_empty`). The reference stops at the footer."""
    small_print = ("\n***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***\n"
                   "Why is this \"Small Print!\" statement here? You know: lawyers.\n"
                   "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*\n")
    out = strip_gutenberg(HEADER + BODY + FOOTER + small_print)
    assert out.body == BODY.rstrip() and out.header.startswith("\ufeffThe Project Gutenberg")
    part = "".join(f"Closing line {i} of a long book.\n" for i in range(120)) + FOOTER + small_print
    assert strip_gutenberg(part).body == part[:part.index("\n\n\nEnd of")]  # a last part too

@pytest.mark.parametrize("text", [
    "Just a novel.\nNo Project Gutenberg markers here.\n",
    "End of the Project Gutenberg EBook in line one, then prose.\n",  # before line 100: kept
    "",
])
def test_a_file_without_markers_is_unchanged(text):
    """Digest check: a file lacking the markers is returned as it is."""
    out = strip_gutenberg(text)
    assert (out.body, out.found, out.header) == (text, False, "")


def test_a_part_without_its_header_loses_the_footer_after_line_100():
    """The last part of a long book (cut by `read`) has the footer but not the header."""
    assert strip_gutenberg(BODY + FOOTER).body == BODY.rstrip()


def test_markers_match_indented_and_in_other_case():
    book = "Title: X\n   ***start of the project gutenberg ebook x***\nBody.\n  *** end of the PROJECT GUTENBERG ebook x ***\nLicence."
    assert strip_gutenberg(book).body == "Body."


def test_credits_only_at_the_start_of_the_body_and_legal_blocks_anywhere():
    body = ("Chapter 1.\nProduced by the mill, the cloth was fine.\n\n"
            "<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS IS COPYRIGHT 1990-1993\n"
            "BY WORLD LIBRARY, INC.\n"
            "SERVICE THAT CHARGES FOR DOWNLOAD TIME OR FOR MEMBERSHIP.>>\n\nChapter 2.\n")
    out = strip_gutenberg("*** START OF THE PROJECT GUTENBERG EBOOK ***\n" + body)
    assert out.body == ("Chapter 1.\nProduced by the mill, the cloth was fine.\n\n\nChapter 2.")


def test_the_stripped_book_is_dated_from_its_kept_header_and_body_alone():
    """After stripping, dating reads the header the stage kept in metadata (title 1848,
    original publication 1850, author 1800-1870) and the body's "written in 1850"; the
    licence's "created in 2009" / "published 2004" are no evidence (2009 is also outside the
    author's life, but a body-only vote is what Chronoberg counts)."""
    doc = Document(text=BOOK, id="b")
    assert GutenbergStripper().filter(doc) is True
    assert doc.text == BODY.rstrip() and "Title: Essays 1848" in doc.metadata["gutenberg_header"]
    md = date_document(doc)
    assert md["year_candidates"] == {"original_publication": 1850, "title": 1848, "text": 1850}
    assert (md["year"], md["author_birth_year"], md["gutenberg_release_year"]) == (1850, 1800, 2004)


def test_a_book_that_is_all_header_is_dropped():
    doc = Document(text=HEADER + FOOTER, id="b")
    assert GutenbergStripper().filter(doc) == (False, "gutenberg_empty")


def test_gutenberg_stage_in_prepare_strips_and_dates(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "11400-0.txt").write_text(BOOK)
    (src / "plain.txt").write_text("A plain text with no markers. " * 5)
    cfg = load_config(None, ['prepare.stages=["read", "gutenberg", "dating", "write"]',
                             "prepare.tasks=1"]).prepare
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    docs = {d.id.rsplit("/", 1)[-1]: d for d in read_documents(tmp_path / "run")}
    book = docs["11400-0.txt"]
    assert book.text == BODY.rstrip() and book.metadata["year"] == 1850
    assert docs["plain.txt"].text == "A plain text with no markers. " * 5


def test_one_file_per_book_by_encoding_priority(tmp_path):
    """A mirror holds a book as N-0.txt (UTF-8), N.txt (ASCII) and N-8.txt (Latin-1); read
    reads both UTF-8-decodable ones (the ASCII one with its accents transliterated, so no
    exact duplicate). Chronoberg reads one file a book: UTF-8, else ASCII, else Latin-1."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "11-0.txt").write_text(HEADER + "Café au lait.\n" + FOOTER)
    (src / "11.txt").write_text(HEADER + "Cafe au lait.\n" + FOOTER)
    (src / "12.txt").write_text(HEADER + "Only in ASCII.\n" + FOOTER)
    (src / "12-8.txt").write_text(HEADER + "Only in ASCII.\n" + FOOTER)  # UTF-8-clean Latin-1
    (src / "2011.txt").write_text("Notes of 2011, not a Gutenberg book.")
    cfg = load_config(None, ['prepare.stages=["read", "gutenberg", "write"]',
                             "prepare.tasks=1"]).prepare
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    kept = {d.id.rsplit("/", 1)[-1]: d.text for d in read_documents(tmp_path / "run")}
    assert kept == {"11-0.txt": "Café au lait.", "12.txt": "Only in ASCII.",
                    "2011.txt": "Notes of 2011, not a Gutenberg book."}


def test_a_book_file_named_alone_is_read_though_a_preferred_one_lies_beside_it(tmp_path):
    """`data.sources` naming `12.txt` reads that file alone: the `12-0.txt` beside it, never
    read, dropped it as gutenberg_other_encoding and the book was lost. A folder source
    holding both still keeps one file a book."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "12-0.txt").write_text(HEADER + "Café au lait.\n" + FOOTER)
    (src / "12.txt").write_text(HEADER + "Cafe au lait.\n" + FOOTER)
    cfg = load_config(None, ['prepare.stages=["read", "gutenberg", "write"]',
                             "prepare.tasks=1"]).prepare
    run_prepare(cfg, tmp_path / "run", [str(src / "12.txt")], progress=False)
    assert [d.text for d in read_documents(tmp_path / "run")] == ["Cafe au lait."]
    run_prepare(cfg, tmp_path / "run2", [str(src)], progress=False)
    assert [d.text for d in read_documents(tmp_path / "run2")] == ["Café au lait."]


def test_a_preferred_file_named_through_a_link_to_its_folder_drops_the_other(tmp_path):
    """`data.sources` may name the one folder two ways (`pg/12.txt` and, through a link to
    `pg`, `link/12-0.txt`: a cluster's /home and /gpfs spellings): the reader reads the
    12-0.txt, so the 12.txt beside it goes, as before the sources were consulted (the
    spelled paths alone kept both files of the book)."""
    src = tmp_path / "pg"
    src.mkdir()
    (src / "12-0.txt").write_text(HEADER + "Café au lait.\n" + FOOTER)
    (src / "12.txt").write_text(HEADER + "Cafe au lait.\n" + FOOTER)
    (tmp_path / "link").symlink_to(src)
    cfg = load_config(None, ['prepare.stages=["read", "gutenberg", "write"]',
                             "prepare.tasks=1"]).prepare
    run_prepare(cfg, tmp_path / "run", [str(src / "12.txt"), str(tmp_path / "link" / "12-0.txt")],
                progress=False)
    assert [d.text for d in read_documents(tmp_path / "run")] == ["Café au lait."]


def test_books_named_one_by_one_are_checked_in_linear_time(tmp_path):
    """A chosen set of books is `data.sources` listing their files: each book's check
    compared its preferred file with every source (2,000 listed: 2.2 s, so 20,000 some
    minutes; now 0.95 s). The sources' places are made once, a book's folders looked up."""
    from linear_time import assert_linear

    def make(n: int):
        folder = tmp_path / f"pg{n}"
        folder.mkdir()
        for i in range(n):  # each listed N.txt has the N-0.txt beside it, not listed
            (folder / f"{i}.txt").write_text("x")
            (folder / f"{i}-0.txt").write_text("x")
        sources = [str(folder / f"{i}.txt") for i in range(n)]
        return sources, [Document(text="x", id=s, metadata={"source": s}) for s in sources]

    def check(made) -> None:
        sources, docs = made
        stripper = GutenbergStripper(sources=sources)
        assert all(stripper.filter(doc) is True for doc in docs)  # each kept: 12-0 never read

    assert_linear(check, make, 100)
