"""Mosaic MDS folders read in place, compared with mosaicml-streaming's own writer and reader.

mosaicml-streaming pins numpy<2.2, so it is not a dev dependency: when it is
installed (``pip install --no-deps mosaicml-streaming`` plus its light imports),
fixtures come from its ``MDSWriter`` and reads are compared with its
``MDSReader``; otherwise a small writer here produces the same layout.
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import zstandard
from test_data import assert_typed

from zephon_dask.data import Dataset
from zephon_dask.data import mds as mds_mod
from zephon_dask.errors import DataFormatError, FieldTypeError, MissingFieldError

COLUMNS = {"text": "str", "id": "int", "score": "float32", "meta": "json", "raw": "bytes",
           "tokens": "ndarray:uint32"}


def streaming():
    """mosaicml-streaming, or None. Its package eagerly imports a vision module needing
    torchvision, which its MDS code never uses: a stand-in is provided while it is imported
    when torchvision is absent, and removed afterwards."""
    stubbed: list[str] = []
    try:
        import torchvision  # noqa: F401
    except Exception:
        tv = types.ModuleType("torchvision")
        tv.datasets = types.ModuleType("torchvision.datasets")
        tv.datasets.VisionDataset = object
        tv.transforms = types.ModuleType("torchvision.transforms")
        tv.transforms.functional = types.ModuleType("torchvision.transforms.functional")
        tv.transforms.functional.to_tensor = None
        for name, module in (("torchvision", tv), ("torchvision.datasets", tv.datasets),
                             ("torchvision.transforms", tv.transforms),
                             ("torchvision.transforms.functional", tv.transforms.functional)):
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
            stubbed.append(name)
    try:
        import streaming as found
        from streaming.base.format import reader_from_json  # noqa: F401
    except Exception:
        found = None
    for name in stubbed:
        sys.modules.pop(name, None)
    return found


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


def write(folder: Path, recs: list[dict], per_shard: int, compression: str | None) -> None:
    mod = streaming()
    if mod is None:
        return own_write(folder, recs, per_shard, compression)
    # size_limit in bytes so that shards hold about ``per_shard`` samples
    with mod.MDSWriter(out=str(folder), columns=COLUMNS, compression=compression,
                       size_limit=per_shard * 200) as w:
        for r in recs:
            w.write(r)


def reference(folder: Path) -> list[dict]:
    """Every sample of a raw MDS folder, by the format's own reader when installed."""
    mod = streaming()
    if mod is None:
        pytest.skip("mosaicml-streaming is not installed")
    from streaming.base.format import reader_from_json

    out = []
    for shard in json.loads((folder / "index.json").read_text())["shards"]:
        reader = reader_from_json(str(folder), None, shard)
        out += [reader.decode_sample(reader.get_sample_data(i)) for i in range(shard["samples"])]
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a
    )


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, np.arange(n))]


@pytest.fixture(autouse=True)
def fresh_caches():
    mds_mod.OFFSETS.clear()
    mds_mod.DECODED.clear()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_records_equal_the_written_samples_and_streaming_reader(tmp_path, compression):
    recs = samples(150)
    write(tmp_path / "m", recs, 40, compression)
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


def test_matches_streaming_reader_on_its_own_and_our_folders(tmp_path):
    recs = samples(60, seed=3)
    write(tmp_path / "theirs", recs, 25, None)
    own_write(tmp_path / "ours", recs, 25, None)
    for folder in ("theirs", "ours"):
        want = reference(tmp_path / folder)
        got = everything(Dataset.from_mds("m", tmp_path / folder))
        assert len(got) == len(want) == 60
        assert all(same(g, {k: (v.item() if isinstance(v, np.generic) else v) for k, v in w.items()})
                   for g, w in zip(got, want, strict=True))


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
