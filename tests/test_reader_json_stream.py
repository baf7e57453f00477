"""A `.json` list of records (at its top or wrapped: `{"data": [...]}`) too large to parse
whole was refused (it took 3.6x its size): it is read in a stream now (kiln.data.json_stream),
in memory that does not grow with it, giving exactly what the whole parse gives: the same
documents (ids, text, metadata, order), the same decisions (records or text, JSON lines,
cut-off and damaged files) and the same counts and skip examples. Here every crafted file is
read both ways, the stream with a read chunk of a few bytes (so every token, escape and
multi-byte character is split across chunks somewhere) and long lines of a few bytes."""

import gzip
import json
import random
import tracemalloc

import pytest
import zstandard

from kiln.data import json_cursor, json_documents, json_stream
from kiln.data.documents import SourceReader
from kiln.errors import InputTooLargeError

RECORDS = [{"text": 'héllo "wörld" \\ € 😀 \ud83d\ude00', "id": 1, "n": 1.5e10, "x": None,
            "t": True, "deep": {"a": [1, {"b": "c"}]}},
           {"text": "two\nlines", "metadata": {"a": 1}, "source": "kept as record_source"},
           {"body": "no text"}, 5, "s", {"text": "   "}, {"text": ["a list"]}]

VALUES = {
    "list": [{"text": "a"}, {"text": "b", "id": 2}],
    "mixed": RECORDS,
    "wrapped": {"data": RECORDS},
    "beside_version": {"version": 1, "rows": [{"text": "x"}, {"text": "y"}]},
    "depth2": {"data": {"train": [{"text": "deep"}]}},
    "depth3": {"data": {"train": {"rows": [{"text": "three"}]}}},
    "depth4": {"a": {"b": {"c": {"d": [{"text": "four: too deep, text"}]}}}},
    "splits": {"train": [{"text": "t"}], "test": [{"text": "u"}, {"text": "v"}]},
    "package": {"name": "pkg", "version": "1.0", "dependencies": {"a": "^1"}},
    "empty_list": [], "empty_wrapped": {"data": []}, "strings": ["a", "b"],
    "some_objects": [{"text": "x"}, 1, "two"], "list_in_list": [[1, 2], {"text": "q"}],
    "one_record": {"text": "one record", "id": 3}, "string": "just a string", "number": 12,
    "only_key": {"corpus": [{"body": "b3", "n": 1}]},
    "only_key_nested": {"only": {"train": [{"text": "in only"}]}},
    "no_text_wrapped": {"data": {"rows": [{"body": "b1"}, {"body": "b2"}]}},
    "launch": {"version": "0.2.0", "configurations": [{"name": "run"}]},
    "schema": {"allOf": [{"if": {"required": ["a"]}, "then": {"maximum": 3}}]},
    "other_key_first": {"meta": {"x": [1, 2], "y": {"z": "w"}}, "data": [{"text": "z"}]},
}

RAW = [  # as the bytes are: duplicate keys, JSONC, cut and damaged files, odd whitespace
    '{"data": [{"text": "a"}], "data": 5}', '{"data": 5, "data": [{"text": "b"}]}',
    '{"x": 1, "data": [{"text": "c"}], "data": [{"text": "d"}]}',
    '{"a": {"data": [{"text": "e"}]}, "a": {"rows": [{"text": "f"}]}}',
    '{"data": [{"text":"a"},]}', '// c\n{"data": [{"text": "a"}]}',
    '{"data": [{"text": "a"}] /* x */}', '{"data": [{"text": "a"}], }',
    '[{"text": "a"}, {"text": "b"}', '[{"text": "a"}, {"te', '{"data": [{"text": "a"}, ',
    '{"data": [{"text": "a\\u00', '{"a": 1 "b": 2}', '{"text": "x"}\n{"text": "y"}\n',
    '{"text": "x"\n{"text": "y"}\n{"text": "z"}\n', '\x0c\n{"data": [{"text": "ff"}]}\n\x0c\n',
    '{"data": [{"text": NaN}, {"text": "-Infinity", "v": -Infinity}]}',
    '[1e5, 2E-3, -0, 0.5, {"text": "num"}]', '[{"text": "a"}] \x0c', '\ufeff\ufeff[]',
    '{"text": "x"}\n// comment\n', '[{"text": "x"}]\n\n   ', '', '   ', '[', '{',
    '[{"text": "\x01"}]', '{"data": [{"text": "a\\qb"}]}', '[{"text": "ok"}] \n [1]',
    '{"version": 1,\n"data": [{"text": "on the second line"}]}',
]
RAW_BYTES = [b'[{"text": "a\xff"}]', b'[{"text": "a"}, x \xff]', b'{"data": [{"text": "\xe4\xb8',
             b'{"data": [{"text": "ok"}]}\xe4', b'\xff\xfe[\x00]\x00',
             b'[{"text": "a\xe4\xb8\xadb"}]', b'{"a": "\xc3\xa9"}\n{"b": 1}\n\xff\n',
             b'\x00\x00[]']


def _files() -> dict[str, bytes]:
    files = {}
    for name, value in VALUES.items():
        for indent in (None, 1, "\t"):
            text = json.dumps(value, indent=indent, ensure_ascii=indent == 1)
            for k, v in enumerate((text, "\ufeff" + text, "  \n" + text + "\n\n", text + " x",
                                   text + "\n" + text)):
                files[f"{name}_{indent!r}_{k}.json"] = v.encode("utf-8", "surrogatepass")
    files.update({f"raw{k}.json": v.encode() for k, v in enumerate(RAW)})
    files.update({f"bytes{k}.json": v for k, v in enumerate(RAW_BYTES)})
    return files


def _read(path, text_field="text"):
    reader = SourceReader([str(path)], progress=False, text_field=text_field)
    docs = [(d.id, d.text, d.metadata) for d in reader.run()]
    return docs, dict(reader.counts), reader.examples.to_json()


def _streamed(monkeypatch, read_bytes=3, line_bytes=8):
    monkeypatch.setattr(json_documents, "WHOLE_JSON_BYTES", 0)  # every file streamed
    monkeypatch.setattr(json_cursor, "READ_BYTES", read_bytes)
    monkeypatch.setattr(json_stream, "LINE_BYTES", line_bytes)


def _both_ways(monkeypatch, folder, files: dict[str, bytes]) -> None:
    for name, raw in files.items():
        (folder / name).write_bytes(raw)
    whole = {name: _read(folder / name) for name in files}
    with monkeypatch.context() as m:
        _streamed(m)
        for name in files:
            assert _read(folder / name) == whole[name], name


def test_every_crafted_file_reads_the_same_streamed(tmp_path, monkeypatch):
    _both_ways(monkeypatch, tmp_path, _files())


@pytest.mark.parametrize("read_bytes,line_bytes", [(1, 1), (7, 4096), (64, 8)])
def test_chunk_and_line_sizes_change_nothing(tmp_path, monkeypatch, read_bytes, line_bytes):
    files = _files()
    for name, raw in files.items():
        (tmp_path / name).write_bytes(raw)
    whole = {name: _read(tmp_path / name) for name in files}
    _streamed(monkeypatch, read_bytes, line_bytes)
    for name in files:
        assert _read(tmp_path / name) == whole[name], name


BASES = [
    json.dumps({"version": 1, "data": [{"text": "a é", "id": 1}, {"text": "b\\n", "n": [1, 2.5]}]},
               indent=1, ensure_ascii=False),
    json.dumps([{"text": "x 数据"}, {"body": "y"}, 3], ensure_ascii=False),
    json.dumps({"data": {"train": [{"text": "t", "v": -1e-3}], "meta": {"k": "v"}}}),
    '{"a": 1,\n // c\n "data": [{"text": "j"},]\n}',
    '{"text": "one", "x": [true, false, null]}\n',
    '{"text": "l1"}\n{"text": "l2"}\n',
]


def test_a_file_cut_anywhere_or_damaged_reads_the_same_streamed(tmp_path, monkeypatch):
    """Cut at every byte (a truncated download: bad_json with the line, or text), and
    bytes replaced at random (structure, quotes, escapes, invalid UTF-8)."""
    rng = random.Random(0)
    files = {}
    for b, base in enumerate(BASES):
        raw = base.encode()
        files |= {f"cut{b}_{n}.json": raw[:n] for n in range(len(raw) + 1)}
        for k in range(60):
            damaged = bytearray(raw)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(len(damaged))] = rng.choice(b'[]{},:" \n\\/x0-e\xff\x0c')
            files[f"damaged{b}_{k}.json"] = bytes(damaged)
    _both_ways(monkeypatch, tmp_path, files)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_files_read_the_same_streamed(tmp_path, monkeypatch, suffix):
    """Also cut off inside the compression: unreadable both ways."""
    compress = gzip.compress if suffix == ".gz" else zstandard.ZstdCompressor().compress
    files = {}
    for b, base in enumerate(BASES):
        raw = base.encode()
        files |= {f"c{b}_{n}.json{suffix}": compress(raw[:n]) for n in range(0, len(raw), 9)}
        whole = compress(raw)
        files[f"cut{b}.json{suffix}"] = whole[:len(whole) - 5]
    for name, value in VALUES.items():
        files[f"{name}.json{suffix}"] = compress(json.dumps(value).encode())
    _both_ways(monkeypatch, tmp_path, files)


def test_another_text_field_reads_the_same_streamed(tmp_path, monkeypatch):
    files = {"a.json": json.dumps({"data": [{"body": "b1"}, {"body": 2}]}).encode(),
             "b.json": json.dumps({"rows": [{"text": "t", "body": "b"}]}).encode()}
    for name, raw in files.items():
        (tmp_path / name).write_bytes(raw)
    whole = [_read(tmp_path / n, "body") for n in files]
    _streamed(monkeypatch)
    assert [_read(tmp_path / n, "body") for n in files] == whole


def _big_records(n):
    return [{"text": f"record {i} " + "words of prose " * 60, "id": i} for i in range(n)]


@pytest.mark.parametrize("shape", ["list", "wrapped"])
def test_a_large_json_is_read_in_memory_well_under_its_size(tmp_path, shape):
    """A 32 MB list (pretty-printed), or one wrapped on one line, took 3.6x its size parsed
    whole; streamed, a read chunk and a record or two."""
    records = _big_records(35_000)
    value = records if shape == "list" else {"version": 1, "data": records}
    path = tmp_path / f"{shape}.json"
    path.write_text(json.dumps(value, indent=1 if shape == "list" else None))
    size = path.stat().st_size
    assert size > 32_000_000
    del records, value
    tracemalloc.start()
    try:
        reader = SourceReader([str(path)], progress=False)
        n = chars = 0
        for doc in reader.run():
            n += 1
            chars += len(doc.text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == reader.counts["documents"] == 35_000
    assert peak < size / 4, f"reading a .json of {size:,} bytes took {peak:,}"


FREE = 4 * 100_000  # JSON_MEMORY_FACTOR (4) x a budget of 100 kB


@pytest.mark.parametrize("name,make", [
    ("list.json", lambda: json.dumps(_big_records(300), indent=1).encode()),
    ("wrapped.json", lambda: json.dumps({"data": _big_records(300)}).encode()),
    ("list.json.gz", lambda: gzip.compress(json.dumps(_big_records(300)).encode())),
])
def test_a_json_over_a_quarter_of_the_free_memory_is_read_not_refused(tmp_path, monkeypatch,
                                                                      name, make):
    """Just over the limit (a budget of 100 kB, a file of ~300 kB): refused before; read
    now, as it reads with memory to spare."""
    path = tmp_path / name
    path.write_bytes(make())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: 1 << 40)
    plenty = _read(path)
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    assert _read(path) == plenty
    assert plenty[1]["documents"] == 300


@pytest.mark.parametrize("name,raw", [
    ("one_record.json", json.dumps({"text": "word " * 100_000, "id": 1}, indent=1).encode()),
    ("commented.json", ("// a comment\n" + json.dumps({"data": _big_records(300)})).encode()),
])
def test_what_must_be_held_whole_is_still_refused_naming_the_file(tmp_path, monkeypatch, name,
                                                                 raw):
    """One record (its text is one document) and JSONC are parsed whole, as before."""
    path = tmp_path / name
    path.write_bytes(raw)
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    with pytest.raises(InputTooLargeError) as refused:
        _read(path)
    message = str(refused.value)
    assert name in message and "JSON lines" in message and "jq -c" in message


def _keyed(n, text_chars=8):
    """Records keyed by their ids, `{"id0": {"text": ...}, ...}`: an object of many members."""
    return json.dumps({f"id{i}": {"text": "w" * text_chars, "n": i} for i in range(n)}).encode()


def test_an_object_of_many_members_is_walked_in_memory_well_under_its_size(tmp_path):
    """Each member's object was walked into (a dict and a node per member, ~20x the file for
    small ones): only the first member's is now, the rest parsed and dropped."""
    path = tmp_path / "keyed.json"
    path.write_bytes(_keyed(20_000, 1_000))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        scan = json_stream.scan(lambda: open(path, "rb"), "text")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert scan.error is None and len(scan.top) == 20_000
    assert peak < size / 3, f"walking a .json of {size:,} bytes took {peak:,}"


def test_an_object_of_many_members_over_the_budget_is_refused_not_walked(tmp_path, monkeypatch):
    """Its walk's members are charged against the budget: over it, the file is refused as
    its whole parse was (InputTooLargeError naming it), not walked until the kernel kills
    the run; under it (the file fits), it is parsed whole, as it always was."""
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    big = tmp_path / "keyed.json"
    big.write_bytes(_keyed(20_000))  # ~500 kB: over the 100 kB budget
    with pytest.raises(InputTooLargeError) as refused:
        _read(big)
    assert "keyed.json" in str(refused.value)
    small = tmp_path / "small.json"
    small.write_bytes(_keyed(2_000))  # ~50 kB: fits, but its walk's members would not
    monkeypatch.setattr(json_documents, "WHOLE_JSON_BYTES", 0)
    streamed = _read(small)
    monkeypatch.setattr(json_documents, "WHOLE_JSON_BYTES", 1 << 30)
    assert streamed == _read(small) and streamed[1]["documents"] == 1


@pytest.mark.parametrize("line_bytes", [1, 2])
def test_a_bom_before_a_blank_first_line_is_not_a_line_however_short_lines_are(
        tmp_path, monkeypatch, line_bytes):
    """A line read `line_bytes` at a time had its first piece checked for the BOM, so a BOM
    split across pieces made a blank first line a line that is no object: with an object
    after it, the file was taken for JSON lines (its one object a record without text)."""
    files = {"bom_blank.json": b'\xef\xbb\xbf  \n{"a": 1}\n',
             "bom_blank_records.json": b'\xef\xbb\xbf\n{"text": "x"}\n',
             "bom_object.json": b'\xef\xbb\xbf{"data": [{"text": "y"}]}'}
    for name, raw in files.items():
        (tmp_path / name).write_bytes(raw)
    whole = {name: _read(tmp_path / name) for name in files}
    _streamed(monkeypatch, 3, line_bytes)
    for name in files:
        assert _read(tmp_path / name) == whole[name], name


def _nested(depth: int, shape: str) -> bytes:
    """A .json whose deepest value is `depth` lists and objects deep, counting the file's."""
    def inner(n):  # n levels of lists, a string with brackets in the middle
        return "[" * n + '"[[{ \\" \\\\"' + "]" * n
    if shape == "records":  # [{"text": ..., "m": <depth - 2>}]
        return ('[{"text": "a", "m": ' + inner(depth - 2) + "}]").encode()
    if shape == "wrapped":  # {"data": [{"text": ..., "m": <depth - 3>}]}
        return ('{"data": [{"text": "a"}, {"text": "b", "m": ' + inner(depth - 3) + "}]}").encode()
    if shape == "beside":  # {"data": [...], "meta": <depth - 1>}
        return ('{"data": [{"text": "a"}],\n "meta": ' + inner(depth - 1) + "}").encode()
    return inner(depth).encode()  # no records: the file is text


@pytest.mark.parametrize("shape", ["records", "wrapped", "beside", "lists"])
def test_both_readers_nest_to_the_same_depth(tmp_path, monkeypatch, shape):
    """The stream was stopped by the recursion limit ~3 levels before the whole parse (a file
    ~986 deep was records one way, skipped the other); both stop at MAX_JSON_DEPTH now, and
    the skip example names the file and the limit."""
    from kiln.data.json_depth import MAX_JSON_DEPTH

    depths = (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 986, 987, 988, 3000)
    files = {f"{shape}{d}.json": _nested(d, shape) for d in depths}
    _both_ways(monkeypatch, tmp_path, files)
    for depth in depths:
        docs, counts, examples = _read(tmp_path / f"{shape}{depth}.json")
        if shape == "lists":  # no records: read as text either way, as before
            assert counts.get("skipped/bad_json") is None and len(docs) == 1
        elif depth <= MAX_JSON_DEPTH:
            assert counts.get("skipped/bad_json") is None and docs, (depth, counts)
        else:
            assert counts == {"skipped/bad_json": 1} and not docs, (depth, counts)
            example = examples["bad_json"]["examples"][0]
            assert example["nested_deeper_than"] == MAX_JSON_DEPTH
            assert example["file"].endswith(f"{shape}{depth}.json")


def test_a_json_error_after_a_value_too_deep_is_the_error_both_ways(tmp_path, monkeypatch):
    """The whole parse finds a later JSON error (a cut-off end) before it checks the depth;
    the stream stopped at the value too deep: a cut-off object with one such value was one
    document of its markup streamed and skipped whole, and a damaged list of records was
    skipped as too deep streamed, as broken at its line whole."""
    deep = "[" * 600 + "]" * 600
    files = {"cut.json": f'{{"a": {deep}, "b": "x'.encode(),
             "error.json": f'[{{"text": "a", "m": {deep}}}, {{"text": "b" "c"}}]'.encode(),
             "lines.json": (f'{{"text": "a", "m": {deep}}}\n' * 3).encode(),
             "deep.json": f'[{{"text": "a", "m": {deep}}}, {{"text": "b"}}]'.encode()}
    _both_ways(monkeypatch, tmp_path, files)
    for name, where in (("cut", "line"), ("error", "line"), ("lines", "line"),
                        ("deep", "nested_deeper_than")):
        docs, counts, examples = _read(tmp_path / f"{name}.json")
        assert counts == {"skipped/bad_json": 1} and not docs, (name, counts)
        assert where in examples["bad_json"]["examples"][0], (name, examples)


def test_a_skip_example_says_how_deep():
    from kiln.data.skip_examples import where

    assert where({"file": "d/a.json", "nested_deeper_than": 512}) == (
        "d/a.json (nested deeper than 512 levels)")


def test_the_depth_is_counted_as_json_nests():
    """Brackets in strings (after escaped quotes and backslashes, beside characters of
    several bytes) are not nesting; the reference is the parsed value's own depth."""
    from kiln.data.json_depth import deeper_than

    def depth(v):
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if inner is None else 1 + max(map(depth, inner), default=0)

    rng = random.Random(3)
    strings = ['[', '{"', '\\', '\\"[', '"]', 'é😀[', '\\\\', "]}", "\n"]

    def value(d):
        if d == 0 or rng.random() < 0.2:
            return "".join(rng.choices(strings, k=rng.randint(0, 4)))
        if rng.random() < 0.5:
            return [value(d - 1) for _ in range(rng.randint(0, 3))]
        return {"".join(rng.choices(strings, k=2)): value(d - 1) for _ in range(rng.randint(0, 3))}

    for _ in range(300):
        v = value(rng.randint(0, 12))
        text = json.dumps(v, ensure_ascii=rng.random() < 0.5)
        d = depth(v)
        for limit in (d - 1, d):
            assert deeper_than(text, limit) == (d > limit) == deeper_than(text.encode(), limit)
            framed = "[1, " + text + "]"  # a slice: the value alone
            assert deeper_than(framed, limit, 4, len(framed) - 1) == (d > limit)


@pytest.mark.parametrize("shape", ["records", "wrapped", "lists"])
def test_a_jsonc_file_nests_to_the_same_depth_as_json(tmp_path, monkeypatch, shape):
    """A `.json` with comments was parsed again without them and past the limit: its records
    were read to ~985 levels (a file of JSON skipped past 512), and deeper it became one
    document of its markup. The limit holds for JSONC too, whole and streamed."""
    from kiln.data.json_depth import MAX_JSON_DEPTH

    depths = (MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 990, 3000)
    files = {f"c{shape}{d}.json": b"// a comment\n" + _nested(d, shape) for d in depths}
    _both_ways(monkeypatch, tmp_path, files)
    for depth in depths:
        docs, counts, examples = _read(tmp_path / f"c{shape}{depth}.json")
        if shape == "lists":  # no records: text either way
            assert counts.get("skipped/bad_json") is None and len(docs) == 1
        elif depth <= MAX_JSON_DEPTH:
            assert counts.get("skipped/bad_json") is None and docs, (depth, counts)
            assert all(not text.startswith("// a comment") for _, text, _ in docs)
        else:
            assert counts == {"skipped/bad_json": 1} and not docs, (depth, counts)
            assert examples["bad_json"]["examples"][0]["nested_deeper_than"] == MAX_JSON_DEPTH


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_json_lines_nest_to_the_same_depth_as_a_json_file(tmp_path, suffix):
    """A JSON line was read up to Python's recursion limit (~990 levels, less under a deeper
    stack) where a `.json` of records stops at MAX_JSON_DEPTH: a line past the limit is a
    bad line now, at its line, and the lines around it are read."""
    from kiln.data.json_depth import MAX_JSON_DEPTH

    def line(depth):  # {"text": ..., "m": <depth - 1 levels>}
        opens, closes = "[" * (depth - 1), "]" * (depth - 1)
        return f'{{"text": "d{depth}", "m": {opens}"[[{{ \\" \\\\"{closes}}}'

    depths = (MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 700, 986, 3000)
    path = tmp_path / f"lines{suffix}"
    path.write_text('{"text": "first"}\n' + "\n".join(line(d) for d in depths) + "\n")
    docs, counts, examples = _read(path)
    assert [text for _, text, _ in docs] == ["first", f"d{MAX_JSON_DEPTH - 1}",
                                             f"d{MAX_JSON_DEPTH}"]
    assert counts["skipped/bad_json"] == 4 and counts["documents"] == 3
    assert examples["bad_json"]["examples"][0]["line"] == 4  # the first line past the limit
