"""`kiln prepare` names what its reader skipped: for each reason, the first few files (with
the line, row or entry where a record was lost), in prepare.json and in the console
warnings; the same files whatever the number of tasks; bounded however many are skipped."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.cli import main
from kiln.data.documents import SourceReader
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.data.provenance import documents_fingerprint
from kiln.data.skip_examples import (
    MAX_EXAMPLES,
    SkipExamples,
    merge_examples,
    write_task_examples,
)
from kiln.errors import NoDocumentsError

READ_WRITE = PrepareConfig(stages=["read", "write"])


def _examples(*sources):
    reader = SourceReader([str(s) for s in sources], progress=False)
    list(reader.run())
    return reader.examples.to_json()


def _corpus(src):
    """8 files of latin-1 text, one jsonl with a bad line 3 and a record without text on line
    5, a hidden file, and good documents."""
    src.mkdir()
    for i in range(8):
        (src / f"latin{i}.txt").write_bytes(b"caf\xe9 au lait\n")
    (src / "d.jsonl").write_text("\n".join([
        json.dumps({"text": "good one"}), json.dumps({"text": "good two"}), "{broken",
        "", json.dumps({"title": "no text here"}), "{also broken"]) + "\n")
    (src / ".hidden.txt").write_text("dot file")
    (src / "good.txt").write_text("a good plain document")
    return src


def test_the_reader_notes_files_and_lines_by_reason(tmp_path):
    src = _corpus(tmp_path / "src")
    found = _examples(src)
    assert found["bad_json"] == {"files": 1, "examples": [
        {"file": str(src / "d.jsonl"), "order": 1, "count": 2, "line": 3}]}
    assert found["no_text"]["examples"] == [
        {"file": str(src / "d.jsonl"), "order": 1, "count": 1, "line": 5, "fields": ["title"]}]
    assert found["hidden"]["examples"] == [{"file": str(src / ".hidden.txt"), "order": 0,
                                            "count": 1}]
    non_utf8 = found["non_utf8"]
    assert non_utf8["files"] == 8  # counted, but only the first few named
    assert [e["file"] for e in non_utf8["examples"]] == [
        str(src / f"latin{i}.txt") for i in range(MAX_EXAMPLES)]
    assert {e["line"] for e in non_utf8["examples"]} == {1}  # where the first bad byte is


def test_parquet_rows_and_json_entries_are_located(tmp_path):
    pq.write_table(pa.table({"text": ["a", None, "b", None]}), tmp_path / "p.parquet")
    (tmp_path / "l.json").write_text(json.dumps([{"text": "x"}, {"text": ""}, {"y": 1}]))
    found = _examples(tmp_path)
    assert found["no_text"]["examples"] == [
        {"file": str(tmp_path / "l.json"), "order": 0, "count": 1, "record": 2, "fields": ["y"]},
        {"file": str(tmp_path / "p.parquet"), "order": 1, "count": 2, "row": 1,
         "not_string": 2, "fields": ["text"]}]  # the column is there: its rows are null
    assert found["empty"]["examples"] == [
        {"file": str(tmp_path / "l.json"), "order": 0, "count": 1, "record": 1}]


def test_examples_merge_by_listing_order_whatever_the_tasks(tmp_path):
    """Each task keeps its own first files; the merge keeps the first in the whole listing."""
    tasks = [SkipExamples() for _ in range(3)]
    for order in range(12):  # file i is read by task i % 3, in order
        tasks[order % 3].add("binary", order, f"f{order}")
    for rank, examples in enumerate(tasks):
        write_task_examples(tmp_path, rank, examples)
    merged = merge_examples(tmp_path, 3)
    assert merged == {"binary": {"files": 12, "examples": [
        {"file": f"f{i}", "count": 1} for i in range(MAX_EXAMPLES)]}}
    assert merge_examples(tmp_path, 4) == merged  # a task that wrote none adds nothing


@pytest.mark.parametrize("tasks", [1, 3])
def test_kiln_prepare_names_the_skipped_files_in_prepare_json_and_warnings(
        tmp_path, capsys, monkeypatch, tasks):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "src")
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", 'data.sources=["src"]',
            "--set", 'prepare.stages=["read", "write"]', "--set", f"prepare.tasks={tasks}"]
    assert main(["prepare", *sets]) == 0
    summary = json.loads((tmp_path / "run" / "prepare.json").read_text())
    assert summary["skipped"] == {"non_utf8": 8, "bad_json": 2, "no_text": 1, "hidden": 1}
    assert summary["skipped_examples"] == {
        "bad_json": {"files": 1, "examples": [{"file": "src/d.jsonl", "count": 2, "line": 3}]},
        "hidden": {"files": 1, "examples": [{"file": "src/.hidden.txt", "count": 1}]},
        "no_text": {"files": 1, "examples": [{"file": "src/d.jsonl", "count": 1, "line": 5,
                                              "fields": ["title"]}]},
        "non_utf8": {"files": 8, "examples": [{"file": f"src/latin{i}.txt", "count": 1,
                                               "line": 1} for i in range(MAX_EXAMPLES)]},
    }
    out, err = capsys.readouterr()
    assert "warning: skipped bad_json (2 in 1 file): src/d.jsonl:3 (2)\n" in err
    # a dot-file loses no text: named in a note, and the stdout summary leaves the lists out
    assert "note: skipped hidden (1 in 1 file): src/.hidden.txt\n" in err
    assert "warning: skipped hidden" not in err and "skipped_examples" not in out
    assert ("warning: skipped non_utf8 (8 in 8 files): src/latin0.txt:1, src/latin1.txt:1, "
            "src/latin2.txt:1, src/latin3.txt:1, src/latin4.txt:1 and 3 more\n") in err


def test_a_prepare_that_reads_nothing_names_the_files_in_its_error(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"\x00\x01")
    (src / "b.txt").write_bytes(b"\xff\xfe\x00\xd8")  # UTF-16 with a lone surrogate
    (src / "c.jsonl").write_text("[1, 2]\n")
    with pytest.raises(NoDocumentsError) as e:
        run_prepare(READ_WRITE, tmp_path / "run", [str(src)], progress=False)
    assert f"\n  skipped binary (1 in 1 file): {src / 'a.bin'}" in str(e.value)
    assert f"\n  skipped no_text (1 in 1 file): {src / 'c.jsonl'}:1" in str(e.value)


def test_a_text_file_with_one_stray_byte_is_named_at_its_line(tmp_path):
    """One Latin-1 byte in a long UTF-8 text skips the whole file; the skip named the file
    alone, leaving the user to search it for the byte."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"line one\nline two\nthe caf\xe9 line\nline four\n")
    (src / "b.txt").write_bytes(b"\xef\xbb\xbfa\n\xff\n")  # after a byte-order mark too
    found = _examples(src)["non_utf8"]["examples"]
    assert [(e["file"], e["line"]) for e in found] == [(str(src / "a.txt"), 3),
                                                        (str(src / "b.txt"), 2)]


def test_a_prepare_stopped_at_a_barrier_names_the_files_too(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"\xff\xff not utf-8")
    cfg = PrepareConfig(stages=["read", "dedup_exact", "write"])
    with pytest.raises(NoDocumentsError, match=r"\n  skipped non_utf8 \(1 in 1 file\): .*a\.txt"):
        run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)


def test_where_the_sources_were_spelled_does_not_change_the_documents_fingerprint(
        tmp_path, monkeypatch):
    """prepare.json names skipped files as the source was spelled; the documents made are
    the same, and so is their fingerprint (token shards made from them stay current)."""
    src = _corpus(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    run_prepare(READ_WRITE, tmp_path / "a", [str(src)], progress=False)
    run_prepare(READ_WRITE, tmp_path / "b", ["src"], progress=False)
    named = [json.loads((tmp_path / r / "prepare.json").read_text())["skipped_examples"]
             ["bad_json"]["examples"][0]["file"] for r in ("a", "b")]
    assert named == [str(src / "d.jsonl"), "src/d.jsonl"]
    assert documents_fingerprint(tmp_path / "a") == documents_fingerprint(tmp_path / "b")


# --- records without the text field: the fields they have -----------------------------------

def _cli_prepare(tmp_path, src, *extra):
    sets = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", f'data.sources=["{src}"]',
            "--set", 'prepare.stages=["read", "write"]']
    for kv in extra:
        sets += ["--set", kv]
    return main(["prepare", *sets])


def test_kiln_prepare_says_which_fields_records_without_text_have(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for shard, records in (("a", range(1200)), ("b", range(3))):  # shards of one dataset
        (src / f"{shard}.jsonl").write_text("".join(
            json.dumps({"id": i, "content": f"article {i}", "url": f"u{i}"}) + "\n"
            for i in records))
    pq.write_table(pa.table({"body": ["x"], "lang": ["en"]}), src / "p.parquet")
    (src / "ok.txt").write_text("one plain document to read")
    assert _cli_prepare(tmp_path, src) == 0
    err = capsys.readouterr().err
    assert (f'warning: {src / "a.jsonl"}, {src / "b.jsonl"}: 1,203 records have no "text" '
            "field (fields seen: content, id, url); to read 'content': "
            "--set data.text_field=content\n") in err  # one hint for files with the same fields
    assert (f'warning: {src / "p.parquet"}: no "text" column (columns: body, lang); to read '
            "'body': --set data.text_field=body\n") in err
    examples = json.loads((tmp_path / "run" / "prepare.json").read_text())["skipped_examples"]
    assert examples["no_text"]["examples"][0]["fields"] == ["id", "content", "url"]
    assert examples["no_text_column"]["examples"][0]["fields"] == ["body", "lang"]


def test_the_hint_names_the_configured_field_and_suggests_text(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": "here", "meta": 1}) + "\n")
    with pytest.raises(NoDocumentsError) as e:
        run_prepare(READ_WRITE, tmp_path / "run", [str(src)], progress=False,
                    text_field="content")
    assert (f'\n  {src / "a.jsonl"}: 1 record has no "content" field (fields seen: meta, '
            "text); to read 'text': --set data.text_field=text") in str(e.value)


def test_a_dotted_text_field_is_told_it_is_no_path_into_a_nested_field(tmp_path):
    """`data.text_field = "data.body"` for records `{"data": {"body": ...}}`: the hint said
    to set data.text_field, which the user had just done, as if the path should work."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"data": {"body": "here"}, "id": 1}) + "\n")
    with pytest.raises(NoDocumentsError) as e:
        run_prepare(READ_WRITE, tmp_path / "run", [str(src)], progress=False,
                    text_field="data.body")
    assert (f'\n  {src / "a.jsonl"}: 1 record has no "data.body" field (fields seen: data, '
            "id); data.text_field names a top-level field, not a path into a nested one") \
        in str(e.value)


def test_a_text_field_holding_a_list_or_a_number_is_named(tmp_path, capsys):
    """Records whose "text" is a list of paragraphs were `no_text` with no hint, as if the
    field were missing; a null one still gets none (it holds no text)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": ["one paragraph", "two"]}) + "\n"
                                 + json.dumps({"text": "fine"}) + "\n")
    pq.write_table(pa.table({"text": [1, 2]}), src / "n.parquet")
    (src / "z.jsonl").write_text(json.dumps({"text": None}) + "\n")
    assert _cli_prepare(tmp_path, src) == 0
    err = capsys.readouterr().err
    assert (f'warning: {src / "a.jsonl"}: "text" holds a list, not a string, in records '
            "skipped as no_text: only a string is read; join a list of paragraphs into one "
            "text\n") in err
    assert (f'warning: {src / "n.parquet"}: "text" holds a number, not a string, in records '
            "skipped as no_text: only a string is read\n") in err
    assert f'warning: {src / "z.jsonl"}:' not in err and "z.jsonl" in err  # skipped, no hint


def test_a_file_mixing_missing_fields_and_lists_names_both(tmp_path, capsys):
    """A file where some records lack "text" and others hold a list of paragraphs in it: the
    hint counted the first and said nothing of the list, so 3 skips were explained as 2."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"content": "x"}, {"content": "y"}, {"text": ["one paragraph", "two"]},
        {"text": "fine"})))
    assert _cli_prepare(tmp_path, src) == 0
    err = capsys.readouterr().err
    assert "skipped no_text (3 in 1 file)" in err
    assert (f'warning: {src / "a.jsonl"}: 2 records have no "text" field (fields seen: '
            "content, text); to read 'content': --set data.text_field=content; in others, "
            '"text" holds a list, not a string, in records skipped as no_text: only a string '
            "is read; join a list of paragraphs into one text\n") in err


def test_no_hint_where_the_field_is_there_but_null_or_no_field_looks_likely(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": None, "n": 1}) + "\n"
                                 + json.dumps({"text": "fine"}) + "\n")
    pq.write_table(pa.table({"text": ["row", None]}), src / "p.parquet")
    (src / "b.jsonl").write_text(json.dumps({"q": "?", "a": "!"}) + "\n" + "[1, 2]\n")
    assert _cli_prepare(tmp_path, src) == 0
    err = capsys.readouterr().err
    assert f'warning: {src / "a.jsonl"}:' not in err  # its "text" is null: no field to set
    assert f'warning: {src / "p.parquet"}:' not in err
    assert (f'warning: {src / "b.jsonl"}: 2 records have no "text" field (fields seen: a, q); '
            "set data.text_field to the one that holds the text\n") in err
    assert "skipped no_text (4 in 3 files)" in err


def test_field_names_are_bounded_per_file(tmp_path):
    from kiln.data.skip_examples import FIELD_SAMPLE_RECORDS, MAX_FIELDS, MAX_NAME_CHARS

    path = tmp_path / "wide.jsonl"
    records = [{f"late{i}": 1} for i in range(FIELD_SAMPLE_RECORDS + 50)]
    records[0] = {"k" * 500: 1, **{f"f{j:02d}": j for j in range(40)}}
    records[FIELD_SAMPLE_RECORDS + 10] = {"never_seen": 1}  # past the sample
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (example,) = _examples(path)["no_text"]["examples"]
    assert example["count"] == len(records)
    assert len(example["fields"]) == MAX_FIELDS
    assert example["fields"][0] == "k" * (MAX_NAME_CHARS - 3) + "..."
    assert "never_seen" not in example["fields"]


# --- formats not read as text ----------------------------------------------------------------

def test_csv_and_html_are_counted_and_named_with_what_is_read(tmp_path, capsys):
    """A table or a web page read as raw text is one document of delimiters or markup: they
    used to be read so, unnamed. Markdown is text, and is read."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.csv").write_text("text,n\nhello,1\n")
    (src / "t.TSV").write_text("text\tn\nhello\t1\n")
    (src / "page.html").write_text("<html><body><p>hi</p></body></html>")
    (src / "notes.md").write_text("# Notes\n\nSome prose in markdown.\n")
    assert _cli_prepare(tmp_path, src) == 0
    summary = json.loads((tmp_path / "run" / "prepare.json").read_text())
    assert summary["documents"] == 1 and summary["skipped"] == {"csv": 2, "html": 1}
    err = capsys.readouterr().err
    assert f"warning: skipped csv (2 in 2 files): {src / 't.TSV'}, {src / 't.csv'}\n" in err
    assert f"warning: skipped html (1 in 1 file): {src / 'page.html'}\n" in err
    (hint,) = [line for line in err.splitlines() if "files are not read" in line]
    assert 'save it as .jsonl or .parquet with a "text" column' in hint
    assert "HTML files are not read" in hint and "extract the text first" in hint
    assert hint.endswith("the read stage reads text files (.txt, .md, source code; "
                         ".txt.gz/.bz2/.xz/.zst), JSON lines (.jsonl, .ndjson; .gz/.bz2/.xz/.zst "
                         "too), .json records (.gz/.bz2/.xz/.zst too) and .parquet")
