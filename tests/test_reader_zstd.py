"""`.zst` files as zstd writers make them: streamed frames without a content size, several
frames in one file (with skippable frames between), windows past libzstd's default bound
(`zstd --long=28` and up); and a cut, which `zstandard`'s own stream reader does not report."""

import io
import json

import pytest
import zstandard

from kiln.data.documents import SourceReader


def _read(*sources):
    reader = SourceReader([str(s) for s in sources], progress=False)
    docs = list(reader.run())
    return docs, dict(reader.counts), reader.examples.to_json()


def _lines(start, stop):
    return "".join(json.dumps({"text": f"r{i}"}) + "\n" for i in range(start, stop)).encode()


def _streamed(raw: bytes, **params) -> bytes:
    """One frame as a stream writes it: no content size in its header."""
    compression = zstandard.ZstdCompressionParameters.from_level(3, **params) if params else None
    out = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=compression).stream_writer(
            out, closefd=False) as w:
        w.write(raw)
    return out.getvalue()


def test_frames_without_content_size_several_frames_and_skippable_frames(tmp_path):
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    blob = (zstandard.compress(_lines(0, 10)) + _streamed(_lines(10, 20)) + skippable
            + zstandard.compress(_lines(20, 30)))
    assert zstandard.get_frame_parameters(_streamed(b"x")).content_size == zstandard.CONTENTSIZE_UNKNOWN
    (tmp_path / "d.jsonl.zst").write_bytes(blob)
    docs, counts, _ = _read(tmp_path)
    assert [d.text for d in docs] == [f"r{i}" for i in range(30)]
    assert not any(k.startswith("skipped/") for k in counts)


def test_a_long_distance_window_past_the_default_bound_is_read(tmp_path):
    """A 256 MiB window (`zstd --long=28`), over libzstd's default 128 MiB bound, which
    refuses the frame ("Frame requires too much memory"); the decoder allocates the window
    the frame declares only as it fills it, so a tiny file stays small in memory."""
    (tmp_path / "long.jsonl.zst").write_bytes(
        _streamed(_lines(0, 50), window_log=28, enable_ldm=True))
    docs, counts, _ = _read(tmp_path)
    assert [d.text for d in docs] == [f"r{i}" for i in range(50)]
    assert not any(k.startswith("skipped/") for k in counts)


@pytest.mark.parametrize("frames", [1, 2])
def test_a_cut_zst_keeps_what_came_before_and_says_so(tmp_path, frames):
    """Cut inside its last frame (any frame before it whole), where `zstandard`'s
    `stream_reader` ends quietly, as if the file were whole."""
    start = 0 if frames == 2 else 100
    first = zstandard.compress(_lines(0, 100)) if frames == 2 else b""
    blob = first + zstandard.compress(_lines(100, 12_000))  # two 128 KiB blocks
    (tmp_path / "cut.jsonl.zst").write_bytes(blob[:-10])
    docs, counts, examples = _read(tmp_path)
    assert 200 < len(docs) < 11_900
    assert [d.text for d in docs] == [f"r{i}" for i in range(start, start + len(docs))]
    assert counts["skipped/unreadable_rest_of_file"] == 1
    assert examples["unreadable_rest_of_file"]["examples"][0]["line"] == len(docs) + 1


def test_bytes_after_the_last_frame_are_damage(tmp_path):
    """Not zstd after the frames: the records before them kept, the file named."""
    (tmp_path / "tail.jsonl.zst").write_bytes(zstandard.compress(_lines(0, 5)) + b"not zstd")
    docs, counts, examples = _read(tmp_path)
    assert [d.text for d in docs] == [f"r{i}" for i in range(5)]
    assert counts["skipped/unreadable_rest_of_file"] == 1
    assert examples["unreadable_rest_of_file"]["examples"][0]["line"] == 6
