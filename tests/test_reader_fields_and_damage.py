"""SourceReader: record fields reach metadata (so M1 and dating see their evidence), a damaged
parquet row group loses only its own rows (counted), a broken .json of records is counted, not
ingested as markup."""

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.data.documents import SourceReader, read_documents
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.prepare_config import BrainRotM1Options
from kiln.data.tokenizer import train_tokenizer


def _read(*sources):
    reader = SourceReader([str(s) for s in sources], progress=False)
    return list(reader.run()), dict(reader.counts)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _fields(doc):
    return {k: v for k, v in doc.metadata.items() if k not in ("source", "bytes")}


# --- record fields -> metadata ---------------------------------------------------------------

def test_jsonl_fields_are_carried_into_metadata(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [
        {"text": "hi", "likes": 900, "retweets": 3, "user": {"name": "a"}, "tags": ["x"],
         "id": "2101.00001"},
        {"likes": 1},  # no text: counted, as before
        {"text": "plain"},
    ])
    docs, counts = _read(path)
    assert [d.id for d in docs] == ["t.jsonl:1", "t.jsonl:3"]
    assert docs[0].metadata == {"source": str(path), "bytes": 2, "likes": 900, "retweets": 3,
                                "user": {"name": "a"}, "tags": ["x"], "id": "2101.00001"}
    assert docs[1].metadata == {"source": str(path), "bytes": 5}
    assert counts["skipped/no_text"] == 1


def test_json_list_and_object_fields_are_carried(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps(
        [{"text": "one", "year": 1850}, {"text": "two", "title": "Notes of 1851"}]))
    (tmp_path / "one.json").write_text(json.dumps({"text": "solo", "date": "1923-04-01"}))
    docs, _ = _read(tmp_path)
    assert [(d.id, _fields(d)) for d in docs] == [
        (f"{tmp_path.name}/list.json:0", {"year": 1850}),
        (f"{tmp_path.name}/list.json:1", {"title": "Notes of 1851"}),
        (f"{tmp_path.name}/one.json", {"date": "1923-04-01"}),
    ]


def test_kiln_keys_win_and_the_records_own_are_renamed(tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", [
        {"text": "abc", "source": "twitter", "bytes": 99, "record_source": "already here"},
        # datatrove's layout (Kiln's own output too): a nested `metadata` is merged in
        {"text": "def", "id": "x/1", "metadata": {"source": "old.txt", "bytes": 3, "likes": 7,
                                                   "lang": "fr"}, "lang": "en"},
    ])
    docs, _ = _read(path)
    assert docs[0].metadata == {"source": str(path), "bytes": 3, "record_bytes": 99,
                                "record_source": "already here",
                                "record_record_source": "twitter"}
    assert docs[1].metadata == {"source": str(path), "bytes": 3, "id": "x/1", "likes": 7,
                                "lang": "en", "record_source": "old.txt", "record_bytes": 3}


def test_fields_json_cannot_hold_are_dropped_and_counted_not_the_document(tmp_path):
    """A lone surrogate or an int past 64 bits parses, but would stop the JSON writer."""
    path = tmp_path / "odd.jsonl"
    path.write_text('{"text": "kept", "big": 123456789012345678901234567890, "bad": "\\ud800",'
                    ' "\\udfff": 1, "ok": 2}\n')
    docs, counts = _read(path)
    assert [(d.text, _fields(d)) for d in docs] == [("kept", {"ok": 2})]
    assert counts["fields/dropped_unwritable"] == 3
    assert counts["documents"] == 1


def test_parquet_columns_are_carried_and_a_bad_utf8_value_loses_nothing(tmp_path):
    """Other columns are read too; invalid UTF-8 in one of them (row 1500, batch 2 of 3) is
    replaced, not the batch: every row is a document."""
    n = 2500
    users = [f"user{i}".encode() for i in range(n)]
    users[1500] = b"bad \xff user"
    tags = pa.array([[f"t{i}".encode()] for i in range(n)], pa.list_(pa.binary()))
    tags = tags.view(pa.list_(pa.string()))
    table = pa.table({
        "likes": pa.array(range(n), pa.int64()),
        "text": [f"post {i}" for i in range(n)],
        "user": pa.array(users, pa.binary()).view(pa.string()),
        "day": pa.array([datetime.date(2013, 5, 18)] * n, pa.date32()),
        "tags": tags,
    })
    pq.write_table(table, tmp_path / "p.parquet")
    docs, counts = _read(tmp_path / "p.parquet")
    assert len(docs) == n and counts["documents"] == n
    assert _fields(docs[7]) == {"likes": 7, "user": "user7", "day": "2013-05-18",
                                "tags": ["t7"]}
    assert docs[1500].metadata["user"] == "bad \ufffd user"
    assert docs[1501].metadata["user"] == "user1501"
    assert counts["fields/replaced_non_utf8"] == 1
    assert "skipped/non_utf8" not in counts and "skipped/unreadable" not in counts


def test_parquet_nested_invalid_utf8_is_none_and_counted(tmp_path):
    tags = pa.array([[b"fine"], [b"\xfe"]], pa.list_(pa.binary())).view(pa.list_(pa.string()))
    pq.write_table(pa.table({"text": ["a", "b"], "tags": tags}), tmp_path / "p.parquet")
    docs, counts = _read(tmp_path / "p.parquet")
    assert [_fields(d) for d in docs] == [{"tags": ["fine"]}, {"tags": None}]
    assert counts["fields/dropped_non_utf8"] == 1


# --- the fields through `kiln prepare` -------------------------------------------------------

def _tweets(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    counts = {"retweets": 0, "replies": 0, "quotes": 0}
    return _jsonl(src / "tweets.jsonl", [
        {"text": "so viral wow", "likes": 900, **counts},             # short, popular: junk
        {"text": " ".join(["word"] * 150), "likes": 2, **counts},     # long, unpopular: control
        {"text": "quiet short post", "likes": 1, **counts},           # neither
        {"text": "no counts here"},                                   # unknown
    ])


def test_brain_rot_m1_classifies_by_the_records_popularity(tmp_path):
    src = _tweets(tmp_path).parent
    tok = tmp_path / "tok.json"
    train_tokenizer(["so viral wow quiet short post word"] * 20, 300, tok, show_progress=False)
    cfg = PrepareConfig(stages=["read", "brain_rot_m1", "write"], tasks=1,
                        brain_rot_m1=BrainRotM1Options(tokenizer=str(tok)))
    summary = run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    docs = list(read_documents(tmp_path / "run"))
    assert [(d.id, d.metadata["m1_class"]) for d in docs] == [
        ("src/tweets.jsonl:2", "control"), ("src/tweets.jsonl:3", "neither"),
        ("src/tweets.jsonl:4", "unknown")]  # the junk tweet is dropped
    assert docs[0].metadata["m1_popularity"] == 2 and docs[0].metadata["likes"] == 2
    assert summary["documents_out"] == 3


def test_dating_reads_the_records_year_date_title_and_arxiv_id(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _jsonl(src / "dated.jsonl", [
        {"text": "a letter", "year": 1850},
        {"text": "a diary", "date": "1923-04-01"},
        {"text": "a paper", "id": "2101.00001"},
        {"text": "a book", "title": "Notes of 1851"},
        {"text": "undated"},
    ])
    cfg = PrepareConfig(stages=["read", "dating", "write"], tasks=1)
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    dated = [(d.metadata.get("year"), d.metadata.get("year_method"))
             for d in read_documents(tmp_path / "run")]
    assert dated == [(1850, "metadata"), (1923, "metadata"), (2021, "arxiv"),
                     (1851, "majority_vote"), (None, None)]


# --- a damaged parquet -----------------------------------------------------------------------

def _damage_row_group(path, group):
    """Overwrite bytes in the middle of the text column's pages of one row group."""
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    mid = start + col.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[mid:mid + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def test_a_damaged_row_group_loses_only_its_rows_counted(tmp_path):
    path = tmp_path / "p.parquet"
    table = pa.table({"text": [f"row {i} " + "word " * 20 for i in range(5000)],
                      "n": list(range(5000))})
    pq.write_table(table, path, row_group_size=1000)
    _damage_row_group(path, 2)
    cut = tmp_path / "cut.parquet"  # an unreadable footer is still the whole file
    pq.write_table(table.slice(0, 10), cut)
    cut.write_bytes(cut.read_bytes()[:-20])
    docs, counts = _read(path, cut)
    assert len(docs) == 4000
    assert counts["skipped/unreadable_rows"] == 1000
    assert counts["skipped/unreadable"] == 1
    rows = [d.metadata["n"] for d in docs]
    assert rows == [*range(2000), *range(3000, 5000)]
    assert docs[2000].id == "p.parquet:3000" and docs[2000].text.startswith("row 3000 ")


# --- a broken .json --------------------------------------------------------------------------

def test_a_cut_off_json_list_is_counted_not_ingested_as_markup(tmp_path):
    (tmp_path / "a.json").write_text('[{"text": "first record text"}, {"text": "second rec')
    (tmp_path / "b.json").write_bytes(b'\xef\xbb\xbf \n[\n  {"text": "one"},\n  {"text": "tw')
    docs, counts = _read(tmp_path)
    assert docs == []
    assert counts == {"skipped/bad_json": 2}


def test_json_lines_saved_as_json_are_read_as_json_lines(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"text": "one", "likes": 5}\n\n{"text": "two"}\n{"text": "thr\n')
    docs, counts = _read(path)
    assert [(d.id, d.text, _fields(d)) for d in docs] == [
        ("d.json:1", "one", {"likes": 5}), ("d.json:3", "two", {})]
    assert counts["skipped/bad_json"] == 1 and counts["documents"] == 2


def test_other_non_json_json_is_still_text(tmp_path):
    config = '{\n  // a comment, as tsconfig.json allows\n  "compilerOptions": {"strict": true}\n}\n'
    (tmp_path / "tsconfig.json").write_text(config)
    (tmp_path / "notes.json").write_text("just prose that mentions a \"text\": key")
    docs, counts = _read(tmp_path)
    assert [d.text for d in docs] == ["just prose that mentions a \"text\": key", config]
    assert counts == {"documents": 2, "bytes": sum(len(d.text) for d in docs)}


def test_prepare_reports_the_record_fields_it_replaced(tmp_path):
    """A document kept with a field changed is in no drop reason: prepare.json and the read
    stage's row of yield.json still say how many fields were replaced or left out."""
    users = [b"ann", b"bad \xff user", b"cy"]
    table = pa.table({"text": ["first post here", "second post here", "third post here"],
                      "user": pa.array(users, pa.binary()).view(pa.string())})
    pq.write_table(table, tmp_path / "p.parquet")
    run = tmp_path / "run"
    summary = run_prepare(PrepareConfig(stages=["read", "write"]), run,
                          sources=[str(tmp_path / "p.parquet")], progress=False)
    assert summary["documents_out"] == 3
    assert summary["field_changes"] == {"replaced_non_utf8": 1}
    read_row = json.loads((run / "yield.json").read_text())["stages"][0]
    assert read_row["field_changes"] == {"replaced_non_utf8": 1}
    assert "replaced_non_utf8" not in json.dumps(read_row["drop_reasons"])
