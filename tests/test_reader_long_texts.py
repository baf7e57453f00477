"""A text too long for the stages after the reader (a `.txt` dump with no line breaks, a
200 MB `text` field) is read as parts of at most MAX_DOCUMENT_CHARS, cut at paragraph, line
or word breaks, nothing lost: kept whole, the prose quality filters' spaCy split needed some
100 bytes of memory per character and failed hours into a run."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from linear_time import assert_linear

from kiln.data.documents import SourceReader

# kiln.data.long_documents.MAX_DOCUMENT_CHARS (spaCy's default max_length), spelled out so
# these tests say what they expect of a reader that has no such module
MAX_DOCUMENT_CHARS = 1_000_000


def _read(*sources, text_field="text"):
    reader = SourceReader([str(s) for s in sources], progress=False, text_field=text_field)
    return list(reader.run()), dict(reader.counts)


def _prose(n_chars: int, seed: int = 0) -> str:
    """Words and sentences, a paragraph break now and then, about `n_chars` long."""
    rng = random.Random(seed)
    words = "the of and to in is that for it as was with be by on not kiln réseau 数据".split()
    out, size = [], 0
    while size < n_chars:
        s = " ".join(rng.choices(words, k=rng.randint(5, 30))) + (
            ".\n\n" if rng.random() < 0.02 else ". ")
        out.append(s)
        size += len(s)
    return "".join(out)


def _check_parts(docs, text, doc_id):
    assert [d.id for d in docs] == [f"{doc_id}#{k}" for k in range(1, len(docs) + 1)]
    assert all(len(d.text) <= MAX_DOCUMENT_CHARS for d in docs)
    assert "".join(d.text for d in docs) == text  # nothing lost, nothing added
    assert all(d.metadata["bytes"] == len(d.text.encode("utf-8")) for d in docs)
    assert all(d.metadata["part_of"] == doc_id for d in docs)  # the train/val split's key


def test_a_long_txt_is_read_as_parts_that_join_to_the_file(tmp_path):
    text = _prose(int(2.5 * MAX_DOCUMENT_CHARS))
    (tmp_path / "dump.txt").write_text(text, encoding="utf-8")
    docs, counts = _read(tmp_path / "dump.txt")
    assert len(docs) == 3
    _check_parts(docs, text, "dump.txt")
    assert counts["long_texts_split"] == 1 and counts["parts"] == 3
    # at paragraph breaks where the window holds one
    assert all(d.text.endswith("\n\n") for d in docs[:-1])


def test_a_long_text_without_line_breaks_is_cut_after_a_space(tmp_path):
    text = _prose(int(1.5 * MAX_DOCUMENT_CHARS)).replace("\n", " ")
    (tmp_path / "one_line.txt").write_text(text, encoding="utf-8")
    docs, _ = _read(tmp_path / "one_line.txt")
    _check_parts(docs, text, "one_line.txt")
    assert len(docs) == 2 and docs[0].text.endswith(" ")


def test_a_long_jsonl_text_field_is_read_as_parts_with_the_record_fields(tmp_path):
    text = _prose(int(2.2 * MAX_DOCUMENT_CHARS), seed=1)
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"text": text, "year": 1999}) + "\n"
                    + json.dumps({"text": "a short one after it", "year": 2000}) + "\n")
    docs, counts = _read(path)
    *parts, short = docs
    _check_parts(parts, text, "big.jsonl:1")
    assert all(d.metadata["year"] == 1999 for d in parts)
    assert (short.id, short.text) == ("big.jsonl:2", "a short one after it")
    assert counts["documents"] == len(parts) + 1


def test_a_long_parquet_text_in_another_column_is_read_as_parts(tmp_path):
    text = _prose(int(1.2 * MAX_DOCUMENT_CHARS), seed=2)
    pq.write_table(pa.table({"content": ["short", text], "n": [1, 2]}), tmp_path / "t.parquet")
    docs, _ = _read(tmp_path / "t.parquet", text_field="content")
    assert docs[0].id == "t.parquet:0" and docs[0].text == "short"
    _check_parts(docs[1:], text, "t.parquet:1")
    assert all(d.metadata["n"] == 2 for d in docs[1:])


def test_a_text_at_the_limit_is_one_document(tmp_path):
    text = ("word " * MAX_DOCUMENT_CHARS)[:MAX_DOCUMENT_CHARS]
    (tmp_path / "at.txt").write_text(text, encoding="utf-8")
    docs, counts = _read(tmp_path / "at.txt")
    assert [(d.id, d.text) for d in docs] == [("at.txt", text)]
    assert "long_texts_split" not in counts


@pytest.mark.parametrize("text, cut", [
    ("aaaaaa\n\nb\ncc dd", "aaaaaa\n\n"),  # a paragraph break before a later line break
    ("aaaaaa\nbb cc", "aaaaaa\n"),       # else a line break
    ("aaaaa bbbbbbbb", "aaaaa "),        # else after a space
    ("abcdefghijklmnop", "abcdefghij"),  # else at the limit
])
def test_split_rule(text, cut):
    from kiln.data.long_documents import split_long_text

    parts = list(split_long_text(text, 10))
    assert parts[0] == cut and "".join(parts) == text
    assert all(len(p) <= 10 for p in parts)


def test_a_last_part_of_a_few_words_is_not_left_alone():
    """The usual cut left 'THE END' as a part of its own, which rules judged part by part
    (C4's five sentences, Gopher's top-2-gram share) drop: a kept text lost its ending. A
    rest of at most 1.5 x the limit is cut near its middle instead."""
    from kiln.data.long_documents import split_long_text

    text = ("a" * 48 + "\n\n") * 2 + "THE END\n"  # the usual cut: after the 2nd paragraph
    assert list(split_long_text(text, 100)) == [text[:50], text[50:]]


def _texts(rng: random.Random, limit: int, n: int):
    """Random texts of up to 6 x `limit`, breaks of every kind dense, rare or missing."""
    for _ in range(n):
        alphabet = rng.choice(["ab \n\t.é", "abcdefgh \n", "abcdefghijklmnop\n", "abc", "a\n"])
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6 * limit)))


@pytest.mark.parametrize("limit", [2, 3, 4, 5, 10, 57, 100])
def test_every_part_holds_a_quarter_of_the_limit_to_the_limit(limit):
    from kiln.data.long_documents import split_long_text

    rng = random.Random(limit)
    for text in _texts(rng, limit, 300):
        parts = list(split_long_text(text, limit))
        assert "".join(parts) == text
        if len(text) <= limit:
            assert parts == [text]
            continue
        assert all(4 * len(p) >= limit and len(p) <= limit for p in parts), (text, parts)


def test_the_end_is_cut_near_the_middle_of_the_rest_at_the_best_break():
    from kiln.data.long_documents import split_long_text

    limit = 100
    # a paragraph break anywhere within a quarter of the limit of the middle beats a line
    # break at it; of two paragraph breaks, the one nearer the middle
    text = "a" * 40 + "\n\n" + "b" * 18 + "\n" + "c" * 8 + "\n\n" + "d" * 48
    assert list(split_long_text(text, limit)) == [text[:71], text[71:]]
    # none within reach: at the middle
    text = "x" * 30 + " " + "y" * 68 + " " + "z" * 30
    assert list(split_long_text(text, limit)) == [text[:65], text[65:]]
    # the usual cut while the rest is over 1.5 x the limit
    text = ("w" * 9 + " ") * 24
    assert [len(p) for p in split_long_text(text, limit)] == [100, 70, 70]


def test_split_is_linear_without_any_break():
    """The worst case for the backward searches: no separator anywhere."""
    from kiln.data.long_documents import MAX_DOCUMENT_CHARS as limit
    from kiln.data.long_documents import split_long_text

    assert limit == MAX_DOCUMENT_CHARS
    assert_linear(lambda text: list(split_long_text(text, 1_000)), lambda k: "x" * k, 50_000,
                  "split_long_text")


def test_prepare_json_says_how_many_texts_were_read_as_parts(tmp_path):
    """The cut is the user's to know: prepare.json (and `kiln prepare`'s summary line, which
    prints it) counts the texts read as parts and the parts they became."""
    from kiln.data.pipeline import PrepareConfig, run_prepare

    src = tmp_path / "src"
    src.mkdir()
    (src / "dump.txt").write_text(_prose(int(2.5 * MAX_DOCUMENT_CHARS)), encoding="utf-8")
    (src / "small.txt").write_text("a short text", encoding="utf-8")
    summary = run_prepare(PrepareConfig(stages=["read", "write"], tasks=1), tmp_path / "run",
                          [str(src)], progress=False)
    assert summary["long_texts"] == {"texts": 1, "parts": 3}
    assert summary["documents_out"] == 4
    assert json.loads((tmp_path / "run" / "prepare.json").read_text())["long_texts"] == \
        {"texts": 1, "parts": 3}
