"""A .json file with comments (JSONC) is read as the same file without them would be: a
config is text like any other config, never `bad_json` nor JSON lines. A JSON-lines .json
whose first line is damaged loses that line alone, as with a damaged later line."""

from linear_time import assert_linear
from test_reader_json_records import _read

from kiln.data.jsonc import strip_jsonc

ESLINTRC = """{
  "overrides": [
    {
      "files": ["*.ts"], // TypeScript only
      "rules": {"no-undef": "off"}
    }
  ],
  /* the rest */
  "root": true,
}
"""
TSCONFIG = '{"compilerOptions": {"strict": true}}\n// strict, see https://x.org/a//b\n'


def test_jsonc_configs_are_text_not_bad_json_nor_json_lines(tmp_path):
    (tmp_path / ".eslintrc.json").write_text(ESLINTRC)
    (tmp_path / "tsconfig.json").write_text(TSCONFIG)
    docs, counts, _ = _read(tmp_path / ".eslintrc.json", tmp_path / "tsconfig.json")
    assert [d.text for d in docs] == [ESLINTRC, TSCONFIG]
    assert not any(k.startswith("skipped/") for k in counts), counts


def test_jsonc_records_are_records_as_without_the_comments(tmp_path):
    (tmp_path / "d.json").write_text('// made by hand\n[{"text": "one"},\n {"text": "two"},]\n')
    docs, counts, _ = _read(tmp_path / "d.json")
    assert [(d.id, d.text) for d in docs] == [("d.json:0", "one"), ("d.json:1", "two")]


def test_a_cut_off_dataset_is_still_bad_json_not_jsonc(tmp_path):
    (tmp_path / "wrap.json").write_text('{"data": [{"content": "a // b"}, {"con')
    docs, counts, _ = _read(tmp_path / "wrap.json")
    assert docs == [] and counts == {"skipped/bad_json": 1}


def test_strip_jsonc_leaves_strings_alone():
    assert strip_jsonc('{"a": "//not", /* c */ "b": [1, "x,]",],}') == \
        '{"a": "//not",   "b": [1, "x,]"]}'


def test_a_damaged_first_json_line_is_counted_and_the_rest_read(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"text": "cut of\n{"text": "two"}\n\n{"text": "three"}\n{"text": "fo\n')
    docs, counts, examples = _read(path)
    assert [(d.id, d.text) for d in docs] == [("d.json:2", "two"), ("d.json:4", "three")]
    assert counts["skipped/bad_json"] == 2
    [example] = examples["bad_json"]["examples"]  # one per file: its first bad line, and count
    assert (example["line"], example["count"]) == (1, 2)
    (tmp_path / "u.json").write_bytes(b'{"text": "caf\xe9"}\n{"text": "b"}\n')  # not UTF-8
    docs, counts, examples = _read(tmp_path / "u.json")
    assert [d.text for d in docs] == ["b"] and counts["skipped/non_utf8"] == 1
    assert examples["non_utf8"]["examples"][0]["line"] == 1


def test_a_pretty_printed_object_is_not_taken_for_json_lines(tmp_path):
    text = '{"a":\n{"b": 1}\n}\n'
    (tmp_path / "p.json").write_text(text)
    docs, counts, _ = _read(tmp_path / "p.json")
    assert [d.text for d in docs] == [text] and "skipped/bad_json" not in counts


def test_stripping_is_linear_time_on_hostile_input():
    for make in (lambda k: "{" + "/* " * k,  # unclosed comments: quadratic once
                 lambda k: "{" + '"\\' * k,
                 lambda k: "[" + ", " * k + "]", lambda k: "{" + "// x\n" * k + "}"):
        assert_linear(strip_jsonc, make, 2_000, make(1))
