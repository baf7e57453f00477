"""Reading back what `kiln prepare` wrote: damage is one error naming the file and line, and
documents added, removed or edited since prepare are refused, never trained on in silence."""

import gzip
import json
import shutil

import pytest

from kiln.data.documents import read_documents  # where it has always been imported from
from kiln.data.pipeline import PrepareConfig, run_prepare
from kiln.errors import RunDataError
from kiln.hashing import file_sha256

REMAKE = r"kiln prepare --set prepare.resume=false"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A finished prepare of 12 text files in 2 tasks (documents/00000 and 00001.jsonl.gz)."""
    root = tmp_path_factory.mktemp("prepared")
    src = root / "src"
    src.mkdir()
    for i in range(12):
        (src / f"f{i:02d}.txt").write_text(f"document {i}: " + "some words " * (i + 3))
    run_prepare(PrepareConfig(stages=["read", "write"], tasks=2), root / "run", [str(src)],
                progress=False)
    return root / "run"


@pytest.fixture
def run(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "run")
    return tmp_path / "run"


def _lines(path):
    return gzip.decompress(path.read_bytes()).decode().splitlines(keepends=True)


def _rewrite(path, lines):
    path.write_bytes(gzip.compress("".join(lines).encode()))


def test_a_whole_prepare_reads_back_every_document(run):
    docs = list(read_documents(run))
    assert len(docs) == 12 and docs[0].id == "src/f00.txt"
    assert docs[0].metadata["bytes"] == len(docs[0].text.encode())


def test_a_bad_json_line_names_the_file_and_line(run):
    path = run / "documents" / "00000.jsonl.gz"
    lines = _lines(path)
    lines[2] = lines[2][:30] + "\n"
    _rewrite(path, lines)
    with pytest.raises(RunDataError, match=rf"00000\.jsonl\.gz line 3: not a JSON record.*{REMAKE}"):
        list(read_documents(run))


def test_a_record_without_text_names_the_file_and_line(run):
    path = run / "documents" / "00001.jsonl.gz"
    lines = _lines(path)
    record = json.loads(lines[1])
    record["content"] = record.pop("text")
    lines[1] = json.dumps(record) + "\n"
    _rewrite(path, lines)
    with pytest.raises(RunDataError, match=r"00001\.jsonl\.gz line 2: a record without a `text`"):
        list(read_documents(run))


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_damaged_gzip_names_the_file(run, damage):
    path = run / "documents" / "00000.jsonl.gz"
    raw = bytearray(path.read_bytes())
    if damage == "cut":
        raw = raw[: len(raw) // 2]
    else:
        for i in range(len(raw) // 2, len(raw) // 2 + 8):
            raw[i] ^= 0x55
    path.write_bytes(bytes(raw))
    with pytest.raises(RunDataError, match=r"00000\.jsonl\.gz.*unreadable gzip"):
        list(read_documents(run))


def test_an_empty_documents_folder_is_one_error(run):
    for path in (run / "documents").iterdir():
        path.unlink()
    with pytest.raises(RunDataError, match=r"holds no documents.*records 12"):
        list(read_documents(run))


def test_a_deleted_file_is_refused_not_half_the_data(run):
    (run / "documents" / "00001.jsonl.gz").unlink()
    with pytest.raises(RunDataError, match=r"holds 6 documents .* records 12 .*removed"):
        list(read_documents(run))


def test_a_stray_copy_is_refused_naming_it(run):
    docs = run / "documents"
    shutil.copy(docs / "00000.jsonl.gz", docs / "00000 (copy).jsonl.gz")
    (docs / "notes.txt").write_text("not documents: ignored")
    with pytest.raises(RunDataError, match=r"holds 18 documents.*not written by it: 00000 \(copy\)"):
        list(read_documents(run))


def test_documents_edited_since_prepare_are_refused(run):
    path = run / "documents" / "00000.jsonl.gz"
    lines = _lines(path)
    record = json.loads(lines[0])
    record["text"] += " and a sentence added by hand"
    lines[0] = json.dumps(record) + "\n"
    _rewrite(path, lines)
    with pytest.raises(RunDataError, match=r"edited since `kiln prepare`"):
        list(read_documents(run))


def test_a_word_edited_with_the_counts_kept_is_refused_naming_the_file(run):
    """The counts cannot tell a word changed for another of its length: the sha256 prepare
    recorded does, before a document is read (a tokenizer is not trained on it first)."""
    path = run / "documents" / "00001.jsonl.gz"
    lines = _lines(path)
    lines[0] = lines[0].replace("words", "wordz", 1)
    _rewrite(path, lines)
    docs = read_documents(run)
    with pytest.raises(RunDataError, match=rf"00001\.jsonl\.gz is not the file `kiln prepare` "
                                           rf"wrote .*prepare\.json records .*{REMAKE}"):
        next(docs)


def test_a_record_with_empty_text_is_counted_and_skipped(run):
    """A document whose text a stage emptied is counted by prepare's meter (0 bytes): read
    back, it is skipped as datatrove skips it, not taken for a lost one."""
    path = run / "documents" / "00000.jsonl.gz"
    lines = _lines(path)
    lines.append(json.dumps({"text": "", "id": "emptied"}) + "\n")
    _rewrite(path, lines)
    summary = json.loads((run / "prepare.json").read_text())
    summary["documents_out"] += 1
    summary["documents_sha256"]["00000.jsonl.gz"] = file_sha256(path)  # as prepare writes it
    (run / "prepare.json").write_text(json.dumps(summary))
    assert len(list(read_documents(run))) == 12


def test_tokenize_and_tokenizer_on_a_lost_file_keep_what_they_made(tiny_run, capsys):
    """`kiln tokenize` and `kiln tokenizer` on documents that lost a file: one line naming the
    folder, exit 1, and the earlier shards and tokenizer stay as they were."""
    from kiln.cli import main

    run = tiny_run
    files = sorted((run / "documents").glob("*.jsonl.gz"))
    assert files, "the tiny run has prepared documents"
    index, tok = (run / "tokens/index.json").read_bytes(), (run / "tokenizer/tokenizer.json").read_bytes()
    lines = _lines(files[0])
    _rewrite(files[0], lines[:-1])  # its last document gone
    for verb in ("tokenize", "tokenizer"):
        assert main([verb, str(run)]) == 1
        err = capsys.readouterr().err
        assert "documents" in err and "records" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert (run / "tokens/index.json").read_bytes() == index
    assert (run / "tokenizer/tokenizer.json").read_bytes() == tok
