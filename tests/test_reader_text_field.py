"""`data.text_field`: datasets that keep their text under another name (`content`,
`raw_content`) are read by setting it, in every format that has fields (jsonl, json,
parquet), through `kiln prepare`; a change of field re-reads a prepared run."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_reader_fields_and_damage import _fields, _jsonl

from kiln.cli import main
from kiln.config import ConfigError, load_config
from kiln.data.documents import SourceReader, read_documents
from kiln.data.pipeline import PrepareConfig, build_pipeline, run_prepare
from kiln.data.provenance import documents_fingerprint

READ_WRITE = PrepareConfig(stages=["read", "write"])


def _read(*sources, text_field="content"):
    reader = SourceReader([str(s) for s in sources], progress=False, text_field=text_field)
    return list(reader.run()), dict(reader.counts)


# --- config ----------------------------------------------------------------------------------

def test_text_field_defaults_to_text_and_is_set_from_the_command_line():
    assert load_config().data.text_field == "text"
    assert load_config(None, ["data.text_field=raw_content"]).data.text_field == "raw_content"


@pytest.mark.parametrize("value, says", [('""', "data.text_field is empty"),
                                         ('"  "', "data.text_field is empty"),
                                         ("3", "data.text_field: expected str")])
def test_an_empty_or_non_text_field_name_is_refused_at_load(value, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, [f"data.text_field={value}"])


# --- the reader --------------------------------------------------------------------------------

def test_jsonl_content_field_is_the_text_and_the_other_fields_metadata(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl", [
        {"content": "first body", "id": 7, "url": "https://a", "text": "a summary"},
        {"text": "only text"},  # the default field is no longer the text
        {"content": "second body"},
    ])
    docs, counts = _read(path)
    assert [(d.id, d.text) for d in docs] == [("c.jsonl:1", "first body"),
                                              ("c.jsonl:3", "second body")]
    assert _fields(docs[0]) == {"id": 7, "url": "https://a", "text": "a summary"}
    assert _fields(docs[1]) == {}
    assert counts["skipped/no_text"] == 1


def test_jsonl_gz_and_json_object_and_list_use_the_field(tmp_path):
    with gzip.open(tmp_path / "z.jsonl.gz", "wt") as f:
        f.write(json.dumps({"raw_content": "zipped", "lang": "en"}) + "\n")
    (tmp_path / "one.json").write_text(json.dumps({"raw_content": "an object", "n": 1}))
    (tmp_path / "many.json").write_text(json.dumps([{"raw_content": "in a list"}, {"x": 1}]))
    docs, counts = _read(tmp_path, text_field="raw_content")
    by_text = {d.text: d for d in docs}
    assert sorted(by_text) == ["an object", "in a list", "zipped"]
    assert _fields(by_text["zipped"]) == {"lang": "en"}
    assert _fields(by_text["an object"]) == {"n": 1}
    assert counts["skipped/no_text"] == 1  # the list entry without the field


def test_json_lines_saved_as_json_are_records_whatever_the_field(tmp_path):
    """JSON lines under a .json name are read as a .jsonl is: with the configured key, its
    records; without it (they used to be one text document of their markup), each line is
    counted `no_text` with the fields it has, for the hint that names the setting."""
    raw = "".join(json.dumps({"content": f"line {i}"}) + "\n" for i in range(3))
    (tmp_path / "lines.json").write_text(raw)
    docs, _ = _read(tmp_path / "lines.json")
    assert [(d.id, d.text) for d in docs] == [("lines.json:1", "line 0"),
                                              ("lines.json:2", "line 1"), ("lines.json:3", "line 2")]
    reader = SourceReader([str(tmp_path / "lines.json")], progress=False)
    assert list(reader.run()) == []
    assert dict(reader.counts) == {"skipped/no_text": 3}
    [example] = reader.examples.to_json()["no_text"]["examples"]
    assert (example["line"], example["count"], example["fields"]) == (1, 3, ["content"])


def test_the_sniffed_key_is_matched_as_json_spells_it(tmp_path):
    """A name with a quote, or outside ASCII, as a JSON file writes it."""
    for name in ('say "hi"', "текст"):
        path = tmp_path / "lines.json"
        path.write_text("".join(json.dumps({name: f"doc {i}"}, ensure_ascii=False) + "\n"
                                for i in range(2)), encoding="utf-8")
        docs, _ = _read(path, text_field=name)
        assert [d.text for d in docs] == ["doc 0", "doc 1"], name


def test_parquet_column_is_the_configured_field(tmp_path):
    pq.write_table(pa.table({"content": ["alpha", None, "beta"], "text": ["s1", "s2", "s3"],
                             "n": [1, 2, 3]}), tmp_path / "p.parquet")
    pq.write_table(pa.table({"text": ["no content column"]}), tmp_path / "q.parquet")
    docs, counts = _read(tmp_path / "p.parquet", tmp_path / "q.parquet")
    assert [(d.id, d.text) for d in docs] == [("p.parquet:0", "alpha"), ("p.parquet:2", "beta")]
    assert _fields(docs[0]) == {"text": "s1", "n": 1}
    assert counts["skipped/no_text"] == 1 and counts["skipped/no_text_column"] == 1


def test_an_empty_field_name_is_refused_by_the_reader(tmp_path):
    with pytest.raises(ValueError, match="text field"):
        SourceReader([str(tmp_path)], text_field="")


# --- prepare ---------------------------------------------------------------------------------

def _both_fields(folder):
    """Records whose `text` and `content` differ but have the same size: the counts alone
    cannot tell which field a prepare read."""
    folder.mkdir()
    _jsonl(folder / "d.jsonl", [{"text": f"summary {i} " * 8, "content": f"article {i} " * 8}
                                for i in range(4)])
    return folder


def test_kiln_prepare_reads_the_field_set_on_the_command_line(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _jsonl(src / "a.jsonl", [{"content": f"body number {i} " * 5, "id": i} for i in range(3)])
    run = tmp_path / "run"
    sets = ["--set", f'run.dir="{run}"', "--set", f'data.sources=["{src}"]',
            "--set", 'prepare.stages=["read", "write"]']
    assert main(["prepare", *sets]) == 1  # nothing has a `text` field
    assert "prepare read no documents" in capsys.readouterr().err
    assert main(["prepare", *sets, "--set", "data.text_field=content"]) == 0
    docs = list(read_documents(run))
    assert [d.text for d in docs] == [f"body number {i} " * 5 for i in range(3)]
    assert [d.metadata["id"] for d in docs] == [0, 1, 2]
    assert json.loads((run / "prepare.json").read_text())["skipped"] == {}
    assert 'text_field = "content"' in (run / "config.toml").read_text()


def test_a_json_list_of_records_without_the_field_gets_the_jsonl_hint(tmp_path, capsys):
    """A .json list of objects, none with `text`, used to be read as one document of JSON
    markup, with no word: it is records, each counted `no_text` with the fields it has and
    the setting that reads one, as JSON lines are."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.json").write_text(json.dumps([{"content": f"body {i}", "id": i} for i in range(3)]))
    (src / "ok.txt").write_text("one plain document to read")
    run = tmp_path / "run"
    sets = ["--set", f'run.dir="{run}"', "--set", f'data.sources=["{src}"]',
            "--set", 'prepare.stages=["read", "write"]']
    assert main(["prepare", *sets]) == 0
    assert [d.text for d in read_documents(run)] == ["one plain document to read"]
    assert json.loads((run / "prepare.json").read_text())["skipped"] == {"no_text": 3}
    err = capsys.readouterr().err
    assert f"warning: skipped no_text (3 in 1 file): {src / 'a.json'} (record 0) (3)\n" in err
    assert (f'warning: {src / "a.json"}: 3 records have no "text" field (fields seen: content, '
            "id); to read 'content': --set data.text_field=content\n") in err
    assert main(["prepare", *sets, "--set", "data.text_field=content"]) == 0
    assert sorted(d.text for d in read_documents(run)) == [
        "body 0", "body 1", "body 2", "one plain document to read"]


def test_json_that_is_not_a_list_of_records_is_still_text(tmp_path):
    """A config object, a list of strings or numbers, a list that mixes objects with other
    values, an empty list: not records, read as text as before (a source tree's JSON)."""
    files = {"config.json": {"name": "x", "version": "1.0"}, "words.json": ["alpha", "beta"],
             "mixed.json": [{"content": "c"}, 3], "none.json": []}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    docs, counts = _read(tmp_path, text_field="text")
    assert {d.id.split("/")[-1]: d.text for d in docs} == {
        name: json.dumps(data) for name, data in files.items()}
    assert not any(k.startswith("skipped/") for k in counts)


def test_a_changed_field_re_reads_instead_of_resuming(tmp_path):
    src = _both_fields(tmp_path / "src")
    run = tmp_path / "run"
    run_prepare(READ_WRITE, run, [str(src)], progress=False)
    first = documents_fingerprint(run)
    assert [d.text for d in read_documents(run)][0].startswith("summary 0")
    run_prepare(READ_WRITE, run, [str(src)], progress=False, text_field="content")
    assert [d.text for d in read_documents(run)][0].startswith("article 0")
    second = documents_fingerprint(run)
    assert second != first  # the same counts and bytes: the shards made before are stale
    run_prepare(READ_WRITE, run, [str(src)], progress=False, text_field="content")
    assert documents_fingerprint(run) == second  # the same field again: the same documents
    run_prepare(READ_WRITE, run, [str(src)], progress=False)
    assert [d.text for d in read_documents(run)][0].startswith("summary 0")
    assert documents_fingerprint(run) == first


def test_the_default_field_leaves_the_recorded_signature_as_before(tmp_path):
    """Runs prepared before the setting existed record no text field: the default must
    not add one, or they would re-prepare and their shards look stale."""
    src = _both_fields(tmp_path / "src")
    _, layout = build_pipeline(READ_WRITE, tmp_path / "run", [str(src)])
    assert "text_field" not in layout["signature"]
    _, layout = build_pipeline(READ_WRITE, tmp_path / "run", [str(src)], text_field="content")
    assert layout["signature"]["text_field"] == "content"


def test_a_parquet_file_without_the_column_counts_its_rows(tmp_path):
    """Each row of a parquet file without the text column is a record lost, as each line of
    a .jsonl without the field is: counted once per file, a file of many rows left the
    yield's kept fraction near 1 however much of the data it held."""
    pq.write_table(pa.table({"body": [f"row {i}" for i in range(5)]}), tmp_path / "q.parquet")
    pq.write_table(pa.table({"text": ["read"]}), tmp_path / "p.parquet")
    docs, counts = _read(tmp_path / "p.parquet", tmp_path / "q.parquet", text_field="text")
    assert [d.text for d in docs] == ["read"]
    assert counts["skipped/no_text_column"] == 5
