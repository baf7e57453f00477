"""Archive safety: every attack is refused with its reason, nothing is extracted, the rest is read."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from kiln.data.arxiv import archives
from kiln.data.arxiv.archives import ArchiveLimits, ArchiveRefused, read_source_archive

DOC = b"\\documentclass{article}\\begin{document}Hello.\\end{document}"


def make_tar(members: list[tuple[tarfile.TarInfo, bytes]], compress: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (member("/etc/evil.tex"), "absolute_path"),
        (member("../../evil.tex"), "path_traversal"),
        (member("a/../../evil.tex"), "path_traversal"),
        (member("link.tex", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
        (member("hard.tex", tarfile.LNKTYPE, "main.tex"), "hardlink"),
        (member("dev.tex", tarfile.CHRTYPE), "device"),
        (member("blk.tex", tarfile.BLKTYPE), "device"),
        (member("fifo.tex", tarfile.FIFOTYPE), "device"),
    ],
)
def test_member_attacks_refused_and_rest_read(bad, reason):
    raw = make_tar([(member("main.tex"), DOC), (bad, b"\\input{x}")], compress=True)
    contents = read_source_archive(raw)
    assert contents.refused == {reason: 1}
    assert list(contents.files) == ["main.tex"]


def test_oversized_member_refused():
    limits = ArchiveLimits(max_member_bytes=100)
    raw = make_tar([(member("main.tex"), DOC), (member("big.tex"), b"x" * 101)])
    contents = read_source_archive(raw, limits=limits)
    assert contents.refused == {"member_too_large": 1}
    assert set(contents.files) == {"main.tex"}


def test_total_over_limit_refused():
    limits = ArchiveLimits(max_member_bytes=1000, max_total_bytes=1500, max_ratio=1e9)
    raw = make_tar([(member(f"f{i}.tex"), b"y" * 900) for i in range(3)])
    with pytest.raises(ArchiveRefused) as err:
        read_source_archive(raw, limits=limits)
    assert err.value.reason == "too_large"


def _spy_on_decompression(monkeypatch) -> list[int]:
    """Bytes each zlib decompress call of `archives` produced, in order."""
    produced: list[int] = []
    real = archives.zlib.decompressobj

    class Spy:
        def __init__(self, *a):
            self.inner = real(*a)

        def decompress(self, data, max_length=0):
            out = self.inner.decompress(data, max_length)
            produced.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(archives.zlib, "decompressobj", Spy)
    return produced


def test_gzip_bomb_stopped_after_limit_plus_one_bytes(monkeypatch):
    bomb = gzip.compress(b"\0" * (20 << 20), compresslevel=9)  # 20 MiB of zeros, ~20 kB
    produced = _spy_on_decompression(monkeypatch)
    limits = ArchiveLimits(max_ratio=50, ratio_floor_bytes=1 << 20)
    with pytest.raises(ArchiveRefused) as err:
        read_source_archive(bomb, limits=limits)
    assert err.value.reason == "bomb_ratio"
    budget = max(int(50 * len(bomb)), 1 << 20)
    assert sum(produced) == budget + 1  # read exactly limit + 1, never the 20 MiB


def test_ratio_rule_spares_small_and_normal_archives():
    text = DOC + b"\n" + b"a " * 5000  # compresses > 100x but stays under the floor
    assert read_source_archive(gzip.compress(text), "x.gz").files == {"x.tex": text.decode()}


@pytest.mark.parametrize(
    "raw",
    [
        gzip.compress(DOC)[:-12],  # truncated gzip
        b"\x1f\x8b" + bytes(range(256)) * 4,  # gzip magic, garbage body
        bytes(range(256)) * 8,  # random binary
        make_tar([(member("main.tex"), DOC * 50)])[:700],  # tar cut inside a member
    ],
)
def test_corrupt_bytes_refused(raw):
    with pytest.raises(ArchiveRefused) as err:
        read_source_archive(raw)
    assert err.value.reason == "corrupt"


def test_formats_gzip_single_file_plain_and_tar():
    assert read_source_archive(gzip.compress(DOC), "2101.00001.gz").files == {"2101.00001.tex": DOC.decode()}
    assert read_source_archive(DOC, "paper.tex").kind == "plain"
    assert read_source_archive(b"just some notes", "notes").files == {}  # not LaTeX
    assert read_source_archive(b"\\input{defs}\\begin {document}x", "p.tex").files  # TeX skips the blank
    tar = read_source_archive(make_tar([(member("./src/a.tex"), DOC), (member("fig.png"), b"PNG")], True))
    assert tar.kind == "tar.gz" and list(tar.files) == ["src/a.tex"]


def test_latin1_fallback():
    contents = read_source_archive("\\documentclass{article} caf\u00e9".encode("latin-1"), "a.tex")
    assert contents.files["a.tex"].endswith("caf\u00e9") and contents.non_utf8 == 1


def break_header(raw: bytes, offset: int) -> bytes:
    """The tar with the header at `offset` made unreadable (its checksum no longer matches)."""
    bad = bytearray(raw)
    bad[offset + 148 : offset + 156] = b"garbage!"
    return bytes(bad)


@pytest.mark.parametrize("compress", [False, True])
def test_bad_header_after_first_member_refuses_archive(compress):
    raw = make_tar([(member("main.tex"), DOC), (member("sec.tex"), b"\\section{Late}")])
    second = 512 + 512  # header + one data block of main.tex
    raw = break_header(raw, second)
    with pytest.raises(ArchiveRefused, match="unreadable tar header") as err:
        read_source_archive(gzip.compress(raw) if compress else raw)
    assert err.value.reason == "corrupt"


@pytest.mark.parametrize("end", ["record_padding", "two_zero_blocks", "no_end_blocks"])
def test_normal_tar_endings_not_flagged(end):
    raw = make_tar([(member("main.tex"), DOC), (member("sec.tex"), b"\\section{Late}")])
    members_end = 4 * 512
    assert len(raw) == 10240 and not raw[members_end:].strip(b"\0")
    raw = {"record_padding": raw, "two_zero_blocks": raw[: members_end + 1024],
           "no_end_blocks": raw[:members_end]}[end]
    assert set(read_source_archive(raw).files) == {"main.tex", "sec.tex"}


@pytest.mark.parametrize("compress", [False, True])
def test_empty_tar_is_empty_not_corrupt(compress):
    contents = read_source_archive(make_tar([], compress=compress))
    assert contents.kind == ("tar.gz" if compress else "tar")
    assert contents.files == {} and contents.members == 0


def test_one_invalid_byte_keeps_the_rest_utf8():
    text = "\\documentclass{article} caf\u00e9, na\u00efve, M\u00fcller, \u2013 "
    raw = text.encode("utf-8") + b"it\x92s"  # one stray cp1252 apostrophe
    contents = read_source_archive(raw, "a.tex")
    assert contents.files["a.tex"] == text + "it\u2019s"
    assert contents.repaired_utf8 == 1 and contents.non_utf8 == 0


def test_legacy_file_read_as_cp1252():
    raw = b"\\documentclass{article} \x93caf\xe9\x94 \x81"  # cp1252 quotes; 0x81 undefined there
    contents = read_source_archive(raw, "a.tex")
    assert contents.files["a.tex"].endswith("\u201ccaf\u00e9\u201d \x81")
    assert contents.non_utf8 == 1 and contents.repaired_utf8 == 0


def test_single_gzipped_file_stops_at_the_member_limit(monkeypatch):
    # A gzipped .tex is one file: it gets a tar member's limit while it is decompressed, not the
    # archive's (200 MiB by default, and the ratio rule is off here) with the check after.
    limits = ArchiveLimits(max_member_bytes=64 << 10, max_ratio=1e9)
    bomb = gzip.compress(DOC + b"\n" + b"A" * (4 << 20), compresslevel=9)  # 4 MiB, ~4 kB
    produced = _spy_on_decompression(monkeypatch)
    with pytest.raises(ArchiveRefused) as err:
        read_source_archive(bomb, "2101.00001.gz", limits)
    assert err.value.reason == "member_too_large"
    assert sum(produced) == limits.max_member_bytes + 1  # never the 4 MiB
    # Up to the limit it is read (sizes around the first tar block too); one byte more is not.
    for size in (100, 512, 513, 64 << 10):
        text = DOC + b"C" * (size - len(DOC))
        assert read_source_archive(gzip.compress(text), "y.gz", limits).files == {"y.tex": text.decode()}
    with pytest.raises(ArchiveRefused, match="member_too_large"):
        read_source_archive(gzip.compress(DOC + b"C" * ((64 << 10) + 1 - len(DOC))), "y.gz", limits)
    # A tar.gz larger than one member's limit is still a tar, read whole.
    members = [(member(f"f{i}.tex"), DOC + b"B" * (40 << 10)) for i in range(3)]
    assert len(read_source_archive(make_tar(members, compress=True), limits=limits).files) == 3


def test_a_utf8_byte_order_mark_is_not_text():
    """Windows editors start a UTF-8 file with a BOM: it went into the paper's text (U+FEFF)
    where the file was \\input."""
    from kiln.data.arxiv import latex_to_text

    bom = b"\xef\xbb\xbf"
    raw = make_tar([(member("main.tex"), bom + b"\\documentclass{article}\\begin{document}"
                     b"\\input{intro}\\end{document}"),
                    (member("intro.tex"), bom + "Intro by G\u00f6del.".encode())])
    contents = read_source_archive(raw)
    assert not any("\ufeff" in text for text in contents.files.values())
    assert latex_to_text(contents.files).body == "Intro by G\u00f6del."
    assert read_source_archive(bom + DOC, "a.tex").files["a.tex"] == DOC.decode()


def test_a_non_utf8_member_name_is_read_as_text_and_can_be_written(tmp_path):
    """A member named in Latin-1 (old submissions) kept its invalid byte as a surrogate: as the
    paper's main_file it crashed the prepare task in the JSONL writer ('surrogates not
    allowed'). The name is read as a file's text is (cp1252 fallback), so \\input{café} finds it."""
    from datatrove.data import Document
    from datatrove.pipeline.writers import JsonlWriter

    from kiln.data.arxiv import LatexToText

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name, data in (("caf\u00e9.tex", b"\\documentclass{article}\\begin{document}"
                                              b"\\input{th\xe9}\\end{document}"),
                           ("th\u00e9.tex", b"Hello from the caf\xe9.")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    files = read_source_archive(buf.getvalue()).files
    assert sorted(files) == ["caf\u00e9.tex", "th\u00e9.tex"]
    (doc,) = LatexToText().run([Document(text="", id="x", metadata={"latex_files": files})])
    assert doc.text.endswith("Body: Hello from the caf\u00e9.")
    assert doc.metadata["main_file"] == "caf\u00e9.tex"
    with JsonlWriter(str(tmp_path)) as writer:
        writer.write(doc)


def test_a_source_folders_non_utf8_file_name_can_be_written(tmp_path):
    """A file of the source folder named in Latin-1 gave the paper an id and `source` holding
    a lone surrogate, which crashed the prepare task in the JSONL writer; escaped `\\xNN`, as
    the read stage names such files."""
    import os

    from datatrove.pipeline.writers import JsonlWriter

    from kiln.data.arxiv.source_reader import ArxivSourceReader

    src = tmp_path / "src"
    src.mkdir()
    name = os.fsdecode(b"caf\xe9.tex")
    (src / name).write_bytes(b"\\documentclass{article}\\begin{document}Hi.\\end{document}")
    (doc,) = ArxivSourceReader(str(src)).run()
    assert doc.id == "caf\\xe9" and doc.metadata["source"].endswith("caf\\xe9.tex")
    with JsonlWriter(str(tmp_path / "out")) as writer:
        writer.write(doc)
