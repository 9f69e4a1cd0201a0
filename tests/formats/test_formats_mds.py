"""Mosaic MDS folders read in place, compared with mosaicml-streaming's own writer and reader.

mosaicml-streaming cannot be a dev dependency: no release installs beside numpy 2.x
and transformers 5 (0.13.0 pins numpy<2.2 and transformers<5). Its ``MDSWriter`` wrote the folders under ``tests/data/mds``
(raw, zstd, gz, bz2; every encoding we read) and its reader's output for them
is ``tests/data/mds/expected.json``: ``tests/data/mds/make_fixtures.py`` made
both, in a separate environment holding the library with its own pins, and
says how to make them again. The other tests write folders with a small writer
here (the same layout).
"""

from __future__ import annotations

import base64
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import zstandard

from tests.formats.test_data import assert_typed
from zephon_dask.data import Dataset
from zephon_dask.data import mds as mds_mod
from zephon_dask.errors import DataFormatError, FieldTypeError, MissingFieldError

COLUMNS = {"text": "str", "id": "int", "score": "float32", "meta": "json", "raw": "bytes",
           "tokens": "ndarray:uint32"}
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "mds"


def samples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"text": f"doc {i} " + "é" * int(rng.integers(0, 30)), "id": int(rng.integers(-5, 1 << 40)),
         "score": float(np.float32(rng.random())), "meta": {"i": i, "tags": ["x"] * (i % 3)},
         "raw": bytes(rng.integers(0, 256, int(rng.integers(0, 20))).astype(np.uint8)),
         "tokens": rng.integers(0, 50_000, int(rng.integers(1, 12))).astype(np.uint32)}
        for i in range(n)
    ]


def ndarray(a: np.ndarray) -> bytes:
    """An ``ndarray:<dtype>`` value: static dtype, so a shape header then the values."""
    assert a.ndim == 1 and a.size < 256
    return bytes([(1 << 2) | 0, a.size]) + a.tobytes()


def own_write(folder: Path, recs: list[dict], per_shard: int, compression: str | None) -> None:
    """A minimal MDS writer (the layout documented in zephon_dask.data.mds)."""
    folder.mkdir(parents=True)
    names = sorted(COLUMNS)
    encs = [COLUMNS[n] for n in names]
    sizes = [8 if e == "int" else 4 if e == "float32" else None for e in encs]
    shards = []
    for k, lo in enumerate(range(0, len(recs), per_shard)):
        blobs = []
        for r in recs[lo : lo + per_shard]:
            cols = {"text": r["text"].encode(), "id": np.int64(r["id"]).tobytes(),
                    "score": np.float32(r["score"]).tobytes(), "meta": json.dumps(r["meta"]).encode(),
                    "raw": r["raw"], "tokens": ndarray(r["tokens"])}
            head = b"".join(np.uint32(len(cols[n])).tobytes() for n, s in zip(names, sizes) if s is None)
            blobs.append(head + b"".join(cols[n] for n in names))
        n = len(blobs)
        starts = 4 * (n + 2) + np.concatenate(([0], np.cumsum([len(b) for b in blobs])))
        data = np.uint32(n).tobytes() + starts.astype(np.uint32).tobytes() + b"".join(blobs)
        raw = f"shard.{k:05d}.mds"
        zipped = None
        if compression:
            zipped = f"{raw}.zstd"
            (folder / zipped).write_bytes(zstandard.ZstdCompressor().compress(data))
        else:
            (folder / raw).write_bytes(data)
        shards.append({"column_encodings": encs, "column_names": names, "column_sizes": sizes,
                       "compression": compression, "format": "mds", "hashes": [],
                       "raw_data": {"basename": raw, "bytes": len(data), "hashes": {}},
                       "samples": n, "size_limit": None, "version": 2,
                       "zip_data": None if zipped is None else {"basename": zipped, "bytes": 0,
                                                                  "hashes": {}}})
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))


def expected() -> dict:
    """What mosaicml-streaming's reader returned for the golden folders (see make_fixtures.py)."""
    return json.loads((GOLDEN / "expected.json").read_text())


def untag(value):
    """A value of expected.json as our reader returns it (arrays, bytes and decimals were tagged)."""
    if isinstance(value, dict) and "ndarray" in value:
        return np.array(value["values"], value["ndarray"]).reshape(value["shape"])
    if isinstance(value, dict) and "bytes" in value:
        return base64.b64decode(value["bytes"])
    if isinstance(value, dict) and "decimal" in value:
        return Decimal(value["decimal"])
    return value


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray)
        else type(a[k]) is type(b[k]) and a[k] == b[k]
        for k in a
    )


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, np.arange(n))]


@pytest.fixture(autouse=True)
def fresh_caches():
    mds_mod.OFFSETS.clear()
    mds_mod.DECODED.clear()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_records_equal_the_written_samples(tmp_path, compression):
    recs = samples(150)
    own_write(tmp_path / "m", recs, 40, compression)
    ds = Dataset.from_path("m", tmp_path / "m")
    assert ds.format == "mds" and ds.num_samples == 150 and ds.num_shards > 1
    got = everything(ds)
    assert all(same(g, r) for g, r in zip(got, recs, strict=True))
    rng = np.random.default_rng(1)
    shard = ds.num_shards - 1
    offs = rng.integers(0, ds.shard_sizes[shard], 25)
    base = sum(ds.shard_sizes[:shard])
    assert all(same(g, recs[base + o]) for g, o in zip(ds.read(shard, offs), offs, strict=True))
    assert ds.identity()["columns"]["column_names"] == sorted(COLUMNS)
    assert not (tmp_path / "m" / "index.json.tmp").exists()


@pytest.mark.parametrize("folder", ["raw", "zstd", "gz", "bz2"])
def test_folders_written_by_streaming_read_as_its_reader_reads_them(folder):
    doc = expected()
    assert folder in doc["folders"]
    want = [{k: untag(v) for k, v in s.items()} for s in doc["samples"]]
    ds = Dataset.from_path("m", GOLDEN / folder)  # detected by its index.json, read in place
    assert ds.format == "mds" and ds.num_shards > 2 and ds.num_samples == len(want) == 24
    schema = ds.meta["schema"]
    assert dict(zip(schema["column_names"], schema["column_encodings"])) == doc["columns"]
    assert ds.meta["compressed"] == [None if folder == "raw" else folder] * ds.num_shards
    got = everything(ds)
    assert all(same(g, w) for g, w in zip(got, want, strict=True))
    # random access: every shard, offsets unsorted and repeated
    base = np.cumsum((0, *ds.shard_sizes))
    rng = np.random.default_rng(4)
    for shard, n in enumerate(ds.shard_sizes):
        offs = rng.integers(0, n, 2 * n)
        rows = ds.read(shard, offs)
        assert all(same(r, want[base[shard] + o]) for r, o in zip(rows, offs, strict=True))


def test_golden_folders_share_one_identity_apart_from_compression():
    ids = {f: Dataset.from_mds("m", GOLDEN / f).identity() for f in ("raw", "zstd", "gz", "bz2")}
    assert all(i["columns"] == ids["raw"]["columns"] for i in ids.values())
    assert all([s["num_samples"] for s in i["shards"]] == [s["num_samples"] for s in ids["raw"]["shards"]]
               for i in ids.values())


def test_bad_mds_folders_are_typed_errors(tmp_path):
    own_write(tmp_path / "m", samples(30), 30, None)
    shard = tmp_path / "m" / "shard.00000.mds"
    good = shard.read_bytes()
    with pytest.raises(MissingFieldError) as ei:
        Dataset.from_mds("m", tmp_path / "m", text_field="body")
    assert_typed(ei, MissingFieldError, ValueError, "body", "text")
    shard.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("m", tmp_path / "m").read(0, [0])
    assert_typed(ei, DataFormatError, ValueError, "shard.00000.mds", "truncated")
    mds_mod.OFFSETS.clear()
    bad = bytearray(good)
    bad[4 * 33 :] = b"\xff" * (len(good) - 4 * 33)  # sample bytes garbled, header intact
    shard.write_bytes(bytes(bad))
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("m", tmp_path / "m").read(0, [3])
    assert_typed(ei, DataFormatError, ValueError, "shard.00000.mds", "sample offset 3", "corrupt")
    own_write(tmp_path / "z", samples(10), 10, "zstd")
    z = tmp_path / "z" / "shard.00000.mds.zstd"
    z.write_bytes(z.read_bytes()[:-8])
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("z", tmp_path / "z").read(0, [0])
    assert_typed(ei, DataFormatError, ValueError, "shard.00000.mds.zstd", "decompress")
    index = json.loads((tmp_path / "m" / "index.json").read_text())
    index["shards"][0]["column_encodings"][0] = "pkl"
    (tmp_path / "m" / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("m", tmp_path / "m")
    assert_typed(ei, DataFormatError, ValueError, "pkl", "unsafe")
    shutil.rmtree(tmp_path / "z")
    own_write(tmp_path / "z", samples(10), 10, None)
    (tmp_path / "z" / "shard.00000.mds").unlink()
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("z", tmp_path / "z")
    assert_typed(ei, DataFormatError, ValueError, "shard.00000.mds", "missing")


@pytest.mark.parametrize("column", ["id", "raw", "score", "tokens"])
def test_non_str_text_column_is_refused_at_construction(tmp_path, column):
    own_write(tmp_path / "m", samples(5), 5, None)
    with pytest.raises(FieldTypeError) as ei:
        Dataset.from_mds("m", tmp_path / "m", text_field=column)
    assert_typed(ei, FieldTypeError, TypeError, repr(column), COLUMNS[column], "text_field=")
    assert Dataset.from_mds("m", tmp_path / "m", text_field="meta").num_samples == 5  # json may hold text
