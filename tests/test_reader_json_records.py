"""A .json dataset in the shapes it comes in (an object wrapping the list, a cut-off download)
is read as records or counted, never ingested as one document of its markup; other JSON
(configs) stays text. JSON lines saved as .json: test_reader_text_field.py."""

import json

from test_reader_fields_and_damage import _fields

from kiln.data.documents import SourceReader
from kiln.data.skip_examples import describe


def _read(*paths, text_field="text"):
    reader = SourceReader([str(p) for p in paths], progress=False, text_field=text_field)
    docs = list(reader.run())
    return docs, dict(reader.counts), reader.examples.to_json()


def _write(folder, files):
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


def test_an_object_wrapping_a_list_of_records_is_read_from_the_list(tmp_path):
    _write(tmp_path, {
        "a.json": {"data": [{"text": "first", "id": 7}, {"text": "second"}]},
        "b.json": {"version": "1.0", "rows": [{"text": "beside a version"}]},  # a records key
        "c.json": {"split": "x", "documents_v2": [{"text": "has the field"}]},  # any name
        "d.json": {"data": {"train": [{"text": "two deep"}]}},
    })
    docs, counts, _ = _read(tmp_path)
    assert [(d.id.split("/")[-1], d.text) for d in docs] == [
        ("a.json:0", "first"), ("a.json:1", "second"), ("b.json:0", "beside a version"),
        ("c.json:0", "has the field"), ("d.json:0", "two deep")]
    assert _fields(docs[0]) == {"id": 7}
    assert not any(k.startswith("skipped/") for k in counts)


def test_wrapped_records_without_the_field_are_counted_with_the_key_path(tmp_path):
    """The wrapper's key is any name when it is the object's only value; the hint names the
    key path."""
    _write(tmp_path, {"w.json": {"data": {"rows": [{"body": "b1"}, {"body": "b2"}]}},
                      "x.json": {"corpus": [{"body": "b3", "n": 1}]}})
    docs, counts, examples = _read(tmp_path)
    assert docs == [] and counts == {"skipped/no_text": 3}
    assert [(e["key"], e["record"], e["fields"]) for e in examples["no_text"]["examples"]] == [
        ("data.rows", 0, ["body"]), ("corpus", 0, ["body", "n"])]
    w, x = tmp_path / "w.json", tmp_path / "x.json"
    assert describe(examples, {"no_text": 3}) == [
        f'skipped no_text (3 in 2 files): {w} (record 0 of "data.rows") (2), '
        f'{x} (record 0 of "corpus")',
        f'{w}: 2 records under "data.rows" have no "text" field (fields seen: body); '
        "to read 'body': --set data.text_field=body",
        f'{x}: 1 record under "corpus" has no "text" field (fields seen: body, n); '
        "to read 'body': --set data.text_field=body"]
    docs, counts, _ = _read(tmp_path, text_field="body")
    assert [d.text for d in docs] == ["b1", "b2", "b3"]


def test_an_object_with_several_lists_of_records_is_skipped_naming_them(tmp_path):
    """A dataset's splits in one object: which to train on (not `test`) is not guessed."""
    _write(tmp_path, {"splits.json": {"train": [{"text": "t"}], "test": [{"text": "u"},
                                                                          {"text": "v"}]}})
    docs, counts, examples = _read(tmp_path)
    assert docs == [] and counts == {"skipped/several_record_lists": 3}
    assert examples["several_record_lists"]["examples"][0]["keys"] == ["train", "test"]
    name = tmp_path / "splits.json"
    assert describe(examples, {"several_record_lists": 3})[1] == (
        f'{name}: records under several keys ("train", "test"), none read, since which to '
        "train on is not guessed: save the list to train on as a .json list or .jsonl file "
        "of its own")


def test_config_objects_holding_lists_of_objects_stay_text(tmp_path):
    """A list of objects among other settings, a schema fragment (objects of objects, no
    string to read), an operation's examples a level down, an empty or non-object list."""
    files = {"launch.json": {"version": "0.2.0", "configurations": [{"name": "run"}]},
             "schema.json": {"allOf": [{"if": {"required": ["a"]}, "then": {"maximum": 3}}]},
             "ops.json": {"version": "1.0", "examples": {"GetThing": [{"title": "get it"}]}},
             "empty.json": {"data": []}, "strings.json": {"items": ["a", "b"]}}
    _write(tmp_path, files)
    docs, counts, _ = _read(tmp_path)
    assert {d.id.split("/")[-1]: d.text for d in docs} == {
        name: json.dumps(data) for name, data in files.items()}
    assert not any(k.startswith("skipped/") for k in counts)


def test_a_cut_off_json_dataset_is_counted_bad_json_whatever_its_field(tmp_path):
    """Cut-off downloads without the text field near the start were one document of
    markup: a list of objects, a wrapper, an object cut at its end (also inside a
    character); named with the line where the JSON broke off. A config broken in its
    middle (comments) stays text."""
    (tmp_path / "list.json").write_text('[\n{"content": "a"},\n{"content": "b')
    (tmp_path / "wrap.json").write_text('{"data": [{"content": "a"}, {"con')
    (tmp_path / "obj.json").write_text('{"title": "x", "body": "cut off here')
    (tmp_path / "utf.json").write_bytes('{"title": "café'.encode()[:-1])
    config = '{\n  "compilerOptions": {\n    // strict mode\n    "strict": true\n  }\n}\n'
    (tmp_path / "tsconfig.json").write_text(config)
    docs, counts, examples = _read(tmp_path)
    assert [d.text for d in docs] == [config]
    assert counts["skipped/bad_json"] == 4
    found = {e["file"].split("/")[-1]: e.get("line") for e in examples["bad_json"]["examples"]}
    assert found == {"list.json": 3, "obj.json": 1, "utf.json": None, "wrap.json": 1}
