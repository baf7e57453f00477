"""Read an arXiv source archive in memory, refusing anything unsafe — nothing touches the disk.

Accepted formats, detected from the bytes (never the file name), in this order: gzip (its payload
is then a tar, or a single .tex file), tar, plain text. The gzip check runs before the tar check,
so a single gzipped .tex is accepted (the digest's reference rejects it by trying tar first).

Refused with a reason, the rest still read:
- members: absolute path, ``..`` traversal, symlink, hard link, device/fifo, over `max_member_bytes`;
- whole archive: corrupt bytes (a tar with anything but zero padding after the last header it
  could read: later members would be lost), decompressed size over `max_total_bytes`, or a
  decompression ratio over `max_ratio` (zip bomb); a single gzipped file over `max_member_bytes`
  (``member_too_large``, as a tar member). Decompression stops after limit+1 output bytes,
  whatever the headers claim.

Text is UTF-8; a mostly-UTF-8 file keeps its UTF-8 and reads each invalid byte as cp1252, and only
a file that is not UTF-8 at all is read as cp1252 (old submissions), so one stray byte does not
garble every accent of the file.
"""

from __future__ import annotations

import codecs
import io
import posixpath
import re
import tarfile
import zlib
from collections import Counter
from dataclasses import dataclass, field

TEX_SUFFIXES = (".tex", ".ltx", ".latex")
MACRO_SUFFIXES = (".sty", ".cls", ".def")
CHUNK = 1 << 16
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # an invalid byte, after "surrogateescape"
NON_ASCII = re.compile("[^\x00-\x7f]")
BEGIN_DOC_BYTES = re.compile(rb"\\begin\s*\{document\}")  # TeX allows blanks before the {


def _cp1252_table(base: int) -> dict[int, str]:
    """Code point base+b -> byte b read as cp1252 (Latin-1 for the 5 bytes cp1252 leaves undefined)."""
    return {base + b: bytes([b]).decode("cp1252", "ignore") or chr(b) for b in range(0x80, 0x100)}


LATIN1_TO_CP1252 = _cp1252_table(0)
ESCAPED_TO_CP1252 = _cp1252_table(0xDC00)


@dataclass(frozen=True)
class ArchiveLimits:
    """Safety limits; the ratio rule only applies once output passes `ratio_floor_bytes`."""

    max_member_bytes: int = 5 * 1024 * 1024  # digest: read .tex members <= 5 MB
    max_total_bytes: int = 200 * 1024 * 1024
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 1024 * 1024
    max_members: int = 10_000


class ArchiveRefused(Exception):
    """The whole archive is refused; `reason` is the stat key."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class ArchiveContents:
    """Decoded LaTeX sources by normalised relative path, plus member-level refusals."""

    files: dict[str, str] = field(default_factory=dict)
    refused: Counter = field(default_factory=Counter)
    kind: str = ""
    members: int = 0  # tar members seen, 0 for an empty tar
    non_utf8: int = 0  # files read as cp1252
    repaired_utf8: int = 0  # UTF-8 files with a few invalid bytes, each read as cp1252


def gunzip_limited(raw: bytes, limits: ArchiveLimits) -> bytes:
    """Decompress (possibly multi-member) gzip, reading at most limit+1 bytes of output.

    The limit is the archive's (`max_total_bytes`, or less by the ratio rule) while the payload
    may be a tar. Once its first block shows it is not one, the payload is a single file, so the
    limit becomes `max_member_bytes`, as for a tar member: a gzipped .tex bomb stops at 5 MB
    (refused as ``member_too_large``) instead of being inflated to 200 MiB and refused after.
    """
    total = min(limits.max_total_bytes, max(int(limits.max_ratio * len(raw)), limits.ratio_floor_bytes))
    if total < limits.max_total_bytes:
        reason, detail = "bomb_ratio", f"> {limits.max_ratio:g}x {len(raw)} bytes"
    else:
        reason, detail = "too_large", f"> {limits.max_total_bytes} bytes"
    limit = min(total, tarfile.BLOCKSIZE)  # until the first block tells a tar from a single file
    probing = True
    out = bytearray()
    data = raw
    try:
        while data:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pos = 0
            while not d.eof:
                chunk = data[pos : pos + CHUNK]
                pos += len(chunk)
                if not chunk and not d.unconsumed_tail:
                    raise ArchiveRefused("corrupt", "truncated gzip stream")
                out += d.decompress(d.unconsumed_tail + chunk, limit + 1 - len(out))
                while True:
                    while d.unconsumed_tail and len(out) <= limit:
                        out += d.decompress(d.unconsumed_tail, limit + 1 - len(out))
                    if len(out) <= limit:
                        break
                    if not probing or limit == total:
                        raise ArchiveRefused(reason, detail)
                    probing, limit = False, total
                    if not _may_be_tar(bytes(out[: tarfile.BLOCKSIZE])) and limits.max_member_bytes < total:
                        limit = limits.max_member_bytes
                        reason, detail = "member_too_large", f"> {limit} bytes (one gzipped file)"
            data = d.unused_data + data[pos:]
            data = data.lstrip(b"\x00")  # zero padding after the last member is legal
    except zlib.error as exc:
        raise ArchiveRefused("corrupt", str(exc)) from exc
    return bytes(out)


def member_problem(member: tarfile.TarInfo, limits: ArchiveLimits) -> str | None:
    """Why a tar member must not be read, or None."""
    name = member.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute_path"
    if ".." in name.replace("\\", "/").split("/"):
        return "path_traversal"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return "device"
    if not member.isfile():
        return "not_regular"
    if member.size > limits.max_member_bytes:
        return "member_too_large"
    return None


def decode_tex(raw: bytes) -> tuple[str, str]:
    """Text and how it was read: "utf8"; "utf8_repaired" when it has more valid non-ASCII UTF-8
    characters than invalid bytes (each invalid byte alone is read as cp1252); else "cp1252", a
    legacy 8-bit file (common in old submissions). A UTF-8 byte-order mark (Windows editors
    write one) is no text: it went into the paper where the file was \\input."""
    raw = raw.removeprefix(codecs.BOM_UTF8)
    text = raw.decode("utf-8", "surrogateescape")
    bad = sum(1 for _ in ESCAPED_BYTE.finditer(text))
    if not bad:
        return text, "utf8"
    if sum(1 for _ in NON_ASCII.finditer(text)) - bad > bad:
        return text.translate(ESCAPED_TO_CP1252), "utf8_repaired"
    return raw.decode("latin-1").translate(LATIN1_TO_CP1252), "cp1252"


def _add_text(out: ArchiveContents, name: str, raw: bytes) -> None:
    out.files[name], how = decode_tex(raw)
    out.non_utf8 += how == "cp1252"
    out.repaired_utf8 += how == "utf8_repaired"


def _is_tar(payload: bytes) -> bool:
    if payload[257:262] == b"ustar" or _is_empty_tar(payload):
        return True
    if len(payload) < 512:
        return False
    try:  # old v7 archives have no magic: the header checksum decides
        tarfile.TarInfo.frombuf(payload[:512], "utf-8", "surrogateescape")
        return True
    except tarfile.HeaderError:
        return False


def _may_be_tar(block: bytes) -> bool:
    """Whether a payload whose first 512 bytes are `block` can be a tar: a tar header, or zeros
    (an empty tar's end blocks)."""
    return block.count(0) == len(block) or _is_tar(block)


def _is_empty_tar(payload: bytes) -> bool:
    """Only end-of-archive blocks: a valid tar with no member (not corrupt binary data)."""
    return len(payload) >= 2 * tarfile.BLOCKSIZE and len(payload) % tarfile.BLOCKSIZE == 0 and (
        payload.count(0) == len(payload))


def _check_tar_end(payload: bytes, offset: int) -> None:
    """tarfile stops at an unreadable header as if the archive ended there: only zero padding may
    follow the last member, else the paper would silently lose its later files."""
    if payload.count(0, offset) != len(payload) - offset:
        raise ArchiveRefused("corrupt", f"unreadable tar header at byte {offset}")


def _read_tar(payload: bytes, limits: ArchiveLimits, out: ArchiveContents) -> None:
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
            for n, member in enumerate(tar):
                if n >= limits.max_members:
                    raise ArchiveRefused("too_many_members", str(n))
                out.members += 1
                if member.isdir():
                    continue
                if problem := member_problem(member, limits):
                    out.refused[problem] += 1
                    continue
                name = posixpath.normpath(member.name.replace("\\", "/"))
                if ESCAPED_BYTE.search(name):  # a non-UTF-8 name (old submissions): read as its text is
                    name = decode_tex(name.encode("utf-8", "surrogateescape"))[0]
                if not name.lower().endswith(TEX_SUFFIXES + MACRO_SUFFIXES):
                    continue
                total += member.size
                if total > limits.max_total_bytes:
                    raise ArchiveRefused("too_large", f"> {limits.max_total_bytes} bytes")
                f = tar.extractfile(member)
                raw = f.read(limits.max_member_bytes + 1) if f else b""
                if len(raw) != member.size:
                    raise ArchiveRefused("corrupt", f"member {name!r} truncated")
                _add_text(out, name, raw)
            _check_tar_end(payload, tar.offset)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveRefused("corrupt", str(exc)) from exc


def _looks_like_latex(raw: bytes) -> bool:
    return b"\\documentclass" in raw or b"\\documentstyle" in raw or BEGIN_DOC_BYTES.search(raw) is not None


def read_source_archive(
    raw: bytes, name: str = "main.tex", limits: ArchiveLimits | None = None
) -> ArchiveContents:
    """Parse one submission's bytes; raises ArchiveRefused for a refused whole archive.

    A single (gzipped or plain) file is kept only if it looks like a LaTeX document
    (``\\documentclass``/``\\documentstyle``/``\\begin{document}``), else `files` is empty.
    """
    limits = limits or ArchiveLimits()
    out = ArchiveContents()
    if len(raw) > limits.max_total_bytes:
        raise ArchiveRefused("too_large", f"{len(raw)} bytes on disk")
    payload, kind = raw, "plain"
    if raw[:2] == b"\x1f\x8b":
        payload, kind = gunzip_limited(raw, limits), "gzip"
    if _is_tar(payload):
        out.kind = "tar.gz" if kind == "gzip" else "tar"
        _read_tar(payload, limits, out)
        return out
    out.kind = kind
    if payload[:5] == b"%PDF-":
        raise ArchiveRefused("pdf_only")
    if b"\x00" in payload[:CHUNK]:
        raise ArchiveRefused("corrupt", "binary data")
    if len(payload) > limits.max_member_bytes:
        raise ArchiveRefused("member_too_large", f"{len(payload)} bytes")
    if _looks_like_latex(payload):
        stem = name.rsplit("/", 1)[-1]
        for ext in (".gz", ".tgz", ".tar"):
            stem = stem.removesuffix(ext)
        _add_text(out, stem if stem.endswith(TEX_SUFFIXES) else stem + ".tex", payload)
    return out
