"""A `.json` array or object was parsed whole (its bytes, their text and the parsed values:
3.6x its size in the reader); one too large for the free memory was read until the kernel
killed the run, with no word of which file or why. A list of records, wrapped or not, is now
read in a stream at any size (test_reader_json_stream.py); what must still be held whole
(one record, JSONC, a value too large to hold) is refused before it is held, naming the
file and the fix (JSON lines); JSON lines saved as `.json` are read a line at a time, at any
size."""

import gzip
import json
import tracemalloc

import pytest

from kiln.data import json_cursor, json_documents, json_records
from kiln.data.documents import SourceReader
from kiln.errors import InputTooLargeError, KilnError

FREE = 4 * 100_000  # JSON_MEMORY_FACTOR (4) x a budget of 100 kB


def _records(n):
    return [{"text": f"record {i} " + "word " * 20, "id": i} for i in range(n)]


SHAPES = {
    "list.json": lambda: json.dumps(_records(2000), indent=1).encode(),  # pretty-printed
    "one_line_list.json": lambda: json.dumps(_records(2000)).encode(),
    "wrapped.json": lambda: json.dumps({"data": _records(2000)}).encode(),  # one line: `{`
    "list.json.gz": lambda: gzip.compress(json.dumps(_records(2000), indent=1).encode()),
    "wrapped.json.gz": lambda: gzip.compress(json.dumps({"data": _records(2000)}).encode()),
}
# what is held whole: one record (its text one document), JSONC, a string over the budget
HELD = {
    "one_record.json": lambda: json.dumps({"text": "word " * 300_000, "id": 1}, indent=1).encode(),
    "one_record_line.json": lambda: json.dumps({"text": "word " * 300_000}).encode(),
    "commented.json": lambda: ("// a comment\n" + json.dumps(_records(2000))).encode(),
    "long_string.json": lambda: json.dumps({"notes": "word " * 300_000,
                                            "data": _records(10)}).encode(),
    "one_record.json.gz": lambda: gzip.compress(json.dumps({"text": "word " * 300_000},
                                                           indent=1).encode()),
}


def _read(path):
    reader = SourceReader([str(path)], progress=False)
    return list(reader.run()), dict(reader.counts)


@pytest.mark.parametrize("name", HELD)
def test_a_json_too_large_for_the_free_memory_is_refused_naming_the_file(tmp_path, monkeypatch,
                                                                         name):
    path = tmp_path / name
    path.write_bytes(HELD[name]())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    with pytest.raises(InputTooLargeError) as refused:
        _read(path)
    message = str(refused.value)
    assert name in message and "JSON lines" in message and "jq -c" in message
    assert isinstance(refused.value, KilnError)  # `kiln` prints it as one line


@pytest.mark.parametrize("name", SHAPES)
def test_a_list_of_records_too_large_to_parse_whole_is_read(tmp_path, monkeypatch, name):
    """Refused before, at a quarter of the free memory: read now, as with memory to spare."""
    path = tmp_path / name
    path.write_bytes(SHAPES[name]())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: None)
    docs, counts = _read(path)
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    assert _read(path) == (docs, counts)
    assert counts["documents"] == 2000


def test_a_refused_compressed_json_is_measured_decompressed(tmp_path, monkeypatch):
    """A .json.gz's size on disk is not what its parse takes: the message said '(1.00 GB on
    disk) is more than this machine's 16.00 GB free' of a 1 GB .json.gz holding 10 GB, and
    suggested a jq that cannot read it compressed."""
    path = tmp_path / "one_record.json.gz"
    path.write_bytes(HELD["one_record.json.gz"]())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    with pytest.raises(InputTooLargeError) as refused:
        _read(path)
    message = str(refused.value)
    assert "decompresses to over" in message and "compressed)" in message
    assert "on disk" not in message and "zcat" in message


@pytest.mark.parametrize("name", ["one_record_line.json", "long_string.json",
                                  "one_record.json.gz"])
def test_a_refused_json_is_not_read_past_its_budget(tmp_path, monkeypatch, name):
    """Refused early: the memory it took stays near the budget (100 kB), not the file's
    size (1.5 MB here; read whole, three times that)."""
    path = tmp_path / name
    path.write_bytes(HELD[name]())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    monkeypatch.setattr(json_records, "READ_CHUNK", 64 << 10)  # of 16 MiB
    monkeypatch.setattr(json_cursor, "READ_BYTES", 64 << 10)  # of 1 MiB
    tracemalloc.start()
    try:
        with pytest.raises(InputTooLargeError):
            _read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"refusing a .json of 1.5 MB took {peak:,} bytes"


def test_json_lines_saved_as_json_are_read_at_any_size(tmp_path, monkeypatch):
    """C4's `.json.gz` are JSON lines: read a line at a time, never refused."""
    path = tmp_path / "c4.json.gz"
    path.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n"
                                            for r in _records(2000))))
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    docs, counts = _read(path)
    assert len(docs) == counts["documents"] == 2000


@pytest.mark.parametrize("free", [None, 1 << 40])
def test_a_json_that_fits_is_read_as_before(tmp_path, monkeypatch, free):
    """Plenty of memory, or none told (no /proc/meminfo): read as it always was."""
    for name, make in SHAPES.items():
        (tmp_path / name).write_bytes(make())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: free)
    docs, counts = _read(tmp_path)
    assert counts["documents"] == len(docs) == 2000 * len(SHAPES)


def test_prepare_stops_with_the_message_not_a_killed_run(tmp_path, monkeypatch):
    from kiln.data.pipeline import PrepareConfig, run_prepare

    src = tmp_path / "src"
    src.mkdir()
    (src / "big.json").write_bytes(HELD["one_record.json"]())
    monkeypatch.setattr(json_documents, "host_memory_available", lambda: FREE)
    with pytest.raises(InputTooLargeError, match=r"big\.json: a \.json is parsed whole"):
        run_prepare(PrepareConfig(stages=["read", "write"], tasks=1), tmp_path / "run",
                    [str(src)], progress=False)
