"""Benchmark files in the shapes benchmarks ship in (HumanEval's `.jsonl.gz`, a `.json` list
export, a byte-order mark) index the same items as plain JSON lines; a file in another
encoding, or whose records hold their text under other fields, is a clear error naming the
file, the line and, for the fields, what the record has and the settings that read it."""

import gzip
import json

import pytest

from kiln.data.decontam import InjectReplicas, NGramIndex, load_benchmark_items
from kiln.data.decontam.ngram_index import benchmark_names

ITEMS = [{"question": f"Natalia sold clips to {i} of her friends in April and then half as "
                      "many in May; how many in all?", "answer": f"{i + 24}"} for i in range(3)]
LINES = "".join(json.dumps(r) + "\n" for r in ITEMS)


@pytest.mark.parametrize("name, data", [
    ("t.jsonl.gz", gzip.compress(LINES.encode())),
    ("t.json", json.dumps(ITEMS, indent=2).encode()),
    ("t.json", json.dumps(ITEMS).encode()),
    ("t.jsonl", b"\xef\xbb\xbf" + LINES.encode()),
    ("t.jsonl", LINES.replace("\n", "\r\n").encode()),
])
def test_benchmark_shapes_read_as_json_lines(tmp_path, name, data):
    (tmp_path / "plain.jsonl").write_text(LINES)
    (tmp_path / name).write_bytes(data)
    assert load_benchmark_items(tmp_path / name) == load_benchmark_items(tmp_path / "plain.jsonl")
    index = NGramIndex.build([tmp_path / name])
    assert index.names == ["t"] and index.info["t"]["items"] == 3
    assert InjectReplicas(tmp_path / name, k=1, seed=0, manifest_dir=tmp_path / "m").items


def test_benchmark_names_drop_every_benchmark_suffix(tmp_path):
    paths = [tmp_path / "humaneval.jsonl.gz", tmp_path / "gsm8k.json", tmp_path / "mbpp.jsonl"]
    assert list(benchmark_names(paths)) == ["humaneval", "gsm8k", "mbpp"]


def test_unreadable_benchmarks_name_file_line_and_fields(tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(LINES.encode() + '{"question": "caf\xe9 au lait"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.jsonl:4: not UTF-8 \(byte 0xe9\)"):
        load_benchmark_items(latin)
    fields = tmp_path / "fields.jsonl"
    fields.write_text(json.dumps({"query": "q", "label": 3, "id": 1}) + "\n")
    with pytest.raises(ValueError, match=r"fields.jsonl:1: .*\(its fields: query, label, id\); "
                                         r"name its fields in prepare.decontaminate.prompt_fields"):
        load_benchmark_items(fields)
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps([ITEMS[0], "stray"]))
    with pytest.raises(ValueError, match=r"listed.json\[1\]: expected a JSON object, got str"):
        load_benchmark_items(listed)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(LINES.encode())[:20])
    with pytest.raises(ValueError, match="cut.jsonl.gz: cannot be read"):
        load_benchmark_items(cut)
