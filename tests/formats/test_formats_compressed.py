"""Compressed JSONL (gzip, zstd): records equal the codec's own reader, chunk reads stay local."""

from __future__ import annotations

import bz2
import gzip
import io
import json

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.formats.test_data import assert_typed
from zephon_dask.data import Dataset
from zephon_dask.data import compressed as compressed_mod
from zephon_dask.data import jsonl as jsonl_mod
from zephon_dask.errors import DataFormatError


@pytest.fixture(autouse=True)
def fresh_caches():
    jsonl_mod.SPANS.clear()
    compressed_mod.SEGMENTS.clear()
    yield
    jsonl_mod.SPANS.clear()
    compressed_mod.SEGMENTS.clear()


def records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 1 << 30, size=(n, 40))
    lengths = rng.integers(1, 40, size=n)
    return [{"text": " ".join(map(str, words[i, : lengths[i]])), "i": i} for i in range(n)]


def jsonl_bytes(recs: list[dict]) -> bytes:
    return "".join(json.dumps(r) + ("\n\n" if r["i"] % 7 == 0 else "\n") for r in recs).encode()


def gzip_members(data: bytes, members: int) -> bytes:
    """``data`` as ``members`` concatenated gzip members (as ``cat a.gz b.gz`` makes)."""
    cuts = np.linspace(0, len(data), members + 1).astype(int)
    return b"".join(gzip.compress(data[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))


def zstd_frames(data: bytes, frames: int) -> bytes:
    cuts = np.linspace(0, len(data), frames + 1).astype(int)
    c = zstandard.ZstdCompressor()
    return b"".join(c.compress(data[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))


def oracle(path) -> list[dict]:
    """The codec's own reader: Python's gzip module or zstandard's stream reader."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        text = gzip.decompress(raw)
    else:
        text = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()
    return [json.loads(line) for line in text.decode().split("\n") if line.strip()]


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(1, 300),
    parts=st.integers(1, 4),
    codec=st.sampled_from(["gz", "zst"]),
    every=st.sampled_from([64, 1000, 1 << 20]),
    seed=st.integers(0, 10),
)
def test_records_equal_the_codecs_reader(tmp_path_factory, n, parts, codec, every, seed):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compressed_mod, "CHECKPOINT_EVERY", every)
        mp.setattr(compressed_mod, "_READ", 97)  # blocks end mid-member, mid-frame
        check_records(tmp_path_factory, n, parts, codec, seed)


def check_records(tmp_path_factory, n, parts, codec, seed):
    d = tmp_path_factory.mktemp("c")
    data = jsonl_bytes(records(n, seed))
    path = d / f"chat.jsonl.{codec}"
    path.write_bytes(gzip_members(data, parts) if codec == "gz" else zstd_frames(data, parts))
    jsonl_mod.SPANS.clear()
    compressed_mod.SEGMENTS.clear()
    ds = Dataset.from_path("c", path, progress=False)
    want = oracle(path)
    assert ds.shard_sizes == (len(want),)
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, len(want), size=min(40, 2 * len(want)))
    assert ds.read(0, offsets) == [want[i] for i in offsets]
    jsonl_mod.SPANS.clear()  # another process: rescans, then reads a chunk
    compressed_mod.SEGMENTS.clear()
    lo = int(rng.integers(0, len(want)))
    assert ds.read(0, np.arange(lo, min(len(want), lo + 16))) == want[lo : lo + 16]


def test_chunk_read_decodes_one_segment_not_the_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(compressed_mod, "CHECKPOINT_EVERY", 4096)
    data = jsonl_bytes(records(3000))
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(data))
    ds = Dataset.from_jsonl("b", tmp_path, progress=False)
    (cp,) = {id(v.checkpoints): v.checkpoints for v in jsonl_mod.SPANS.values()}.values()
    assert len(cp.states) > 20
    compressed_mod.SEGMENTS.clear()
    assert ds.read(0, np.arange(2500, 2510)) == [json.loads(x) for x in
                                                 data.decode().split("\n") if x][2500:2510]
    assert 0 < compressed_mod.SEGMENTS.total_weight < len(data) / 10


def test_gzip_file_named_jsonl_is_sniffed(tmp_path):
    recs = records(20)
    (tmp_path / "chat.jsonl").write_bytes(gzip.compress(jsonl_bytes(recs)))
    ds = Dataset.from_jsonl("c", tmp_path / "chat.jsonl", progress=False)
    assert ds.num_samples == 20 and ds.read(0, [19, 3]) == [recs[19], recs[3]]


def test_bad_compressed_files_are_typed_errors(tmp_path):
    data = jsonl_bytes(records(200))
    gz = gzip.compress(data)
    (tmp_path / "trunc.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_jsonl("t", tmp_path / "trunc.jsonl.gz", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "trunc.jsonl.gz", "truncated", "again")
    corrupt = bytearray(gz)
    corrupt[len(gz) // 2 : len(gz) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(corrupt))
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_jsonl("b", tmp_path / "bad.jsonl.gz", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "bad.jsonl.gz", "corrupt", "compressed byte")
    zs = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "trunc.jsonl.zst").write_bytes(zs[:-20])
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_jsonl("z", tmp_path / "trunc.jsonl.zst", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "trunc.jsonl.zst", "truncated")
    (tmp_path / "x.jsonl").write_bytes(bz2.compress(data))
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_jsonl("x", tmp_path / "x.jsonl", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "x.jsonl", "bzip2", "gzip or zstd")
    bad_line = data.replace(b'{"text": ', b'{"text" ', 1)
    (tmp_path / "line.jsonl.gz").write_bytes(gzip.compress(bad_line))
    with pytest.raises(DataFormatError) as ei:  # the first record is read at construction
        Dataset.from_jsonl("l", tmp_path / "line.jsonl.gz", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "line.jsonl.gz", "line 1", "offset 0")
    first, rest = data.split(b"\n", 1)
    (tmp_path / "second.jsonl.gz").write_bytes(gzip.compress(first + b"\n" + rest.replace(b'{"text": ', b'{"text" ', 1)))
    ds = Dataset.from_jsonl("s", tmp_path / "second.jsonl.gz", progress=False)
    with pytest.raises(DataFormatError) as ei:
        ds.read(0, [1])
    assert_typed(ei, DataFormatError, ValueError, "second.jsonl.gz", "line ", "offset 1")


def test_changed_compressed_file_is_detected(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(records(50))))
    ds = Dataset.from_jsonl("a", path, progress=False)
    path.write_bytes(gzip.compress(jsonl_bytes(records(60))))
    jsonl_mod.SPANS.clear()
    with pytest.raises(DataFormatError) as ei:
        ds.read(0, [0])
    assert_typed(ei, DataFormatError, ValueError, "changed since it was indexed")
