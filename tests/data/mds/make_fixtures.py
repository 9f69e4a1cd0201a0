"""Write the MDS golden fixtures with mosaicml-streaming itself (run once, offline afterwards).

mosaicml-streaming cannot be a dev dependency (it pins numpy<2.2 and
transformers<5), so tests/formats/test_formats_mds.py compares our reader with what the
real library wrote and read back, committed here. Regenerate in a separate
virtual environment holding the library with its own pins::

    python3 -m venv /tmp/msvenv
    /tmp/msvenv/bin/pip install "mosaicml-streaming==0.13.0"
    /tmp/msvenv/bin/python tests/data/mds/make_fixtures.py

It writes one folder per compression (``raw``, ``zstd``, ``gz``, ``bz2``) with
``MDSWriter``, reads every sample back with the library's own reader (a
compressed shard decompressed by the library's ``decompress`` first, as its
datasets do) and stores what the reader returned in ``expected.json``, once,
after checking that every folder read back the same samples, equal to those
written. This script never imports zephon_dask.
"""

from __future__ import annotations

import base64
import importlib.machinery
import json
import platform
import shutil
import sys
import tempfile
import types
from decimal import Decimal
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMPRESSIONS = {"raw": None, "zstd": "zstd", "gz": "gz", "bz2": "bz2"}
# every encoding zephon_dask reads (pickle and images are refused by design)
COLUMNS = {
    "text": "str", "raw": "bytes", "id": "int", "meta": "json",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "f16": "float16", "f32": "float32", "f64": "float64",
    "s_int": "str_int", "s_float": "str_float", "s_dec": "str_decimal",
    "arr": "ndarray", "tokens": "ndarray:uint32", "grid": "ndarray:int16:2,3",
}
SAMPLES = 24
SIZE_LIMIT = 2400  # bytes per shard: a few shards of raw samples


def import_streaming():
    """The library. Its package imports a vision module eagerly, needing a working torchvision
    (whose compiled ops fail against a CPU-only torch); the MDS code never uses it, so a
    stand-in is put in place only when torchvision cannot be imported."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
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
    import streaming

    return streaming


def samples() -> list[dict]:
    rng = np.random.default_rng(13)
    out = []
    for i in range(SAMPLES):
        n = int(rng.integers(1, 9))
        out.append({
            "text": "" if i == 7 else f"doc {i} " + "é✓" * int(rng.integers(0, 12)),
            "raw": b"" if i == 3 else bytes(rng.integers(0, 256, int(rng.integers(1, 16))).astype(np.uint8)),
            "id": int(rng.integers(-(1 << 62), 1 << 62)),
            "meta": {"i": i, "tags": ["x"] * (i % 3), "nested": {"ok": i % 2 == 0, "none": None}},
            "u8": int(rng.integers(0, 1 << 8)), "u16": int(rng.integers(0, 1 << 16)),
            "u32": int(rng.integers(0, 1 << 32)),
            "u64": (1 << 64) - 1 if i == 0 else int(rng.integers(0, 1 << 63)),
            "i8": int(rng.integers(-(1 << 7), 1 << 7)), "i16": int(rng.integers(-(1 << 15), 1 << 15)),
            "i32": int(rng.integers(-(1 << 31), 1 << 31)),
            "i64": -(1 << 63) if i == 0 else int(rng.integers(-(1 << 62), 1 << 62)),
            "f16": float(rng.normal()), "f32": float(rng.normal()), "f64": float(rng.normal()),
            "s_int": int(rng.integers(-(10**12), 10**12)), "s_float": float(rng.normal() * 1e3),
            "s_dec": Decimal(f"{int(rng.integers(-10**6, 10**6))}.{int(rng.integers(0, 1000)):03d}"),
            "arr": rng.normal(size=(int(rng.integers(1, 4)), n)).astype(
                ["float32", "float64", "int64", "uint8"][i % 4]),
            "tokens": rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32),
            "grid": rng.integers(-(1 << 15), 1 << 15, (2, 3)).astype(np.int16),
        })
    return out


def tagged(value):
    """A decoded value as JSON: arrays, bytes and decimals tagged with what they were."""
    if isinstance(value, np.ndarray):
        return {"ndarray": value.dtype.name, "shape": list(value.shape), "values": value.ravel().tolist()}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_back(streaming, folder: Path) -> list[dict]:
    """Every sample of ``folder``, in index order, by the library's reader."""
    from streaming.base.compression import decompress
    from streaming.base.format import reader_from_json

    index = json.loads((folder / "index.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp)
        out = []
        for shard in index["shards"]:
            raw = shard["raw_data"]["basename"]
            if (folder / raw).exists():
                shutil.copy(folder / raw, local / raw)
            else:
                zipped = (folder / shard["zip_data"]["basename"]).read_bytes()
                (local / raw).write_bytes(decompress(shard["compression"], zipped))
            reader = reader_from_json(str(local), None, shard)
            out += [reader.decode_sample(reader.get_sample_data(i)) for i in range(shard["samples"])]
    return out


def main() -> None:
    streaming = import_streaming()
    recs = samples()
    want = [{k: tagged(v) for k, v in r.items()} for r in recs]
    for name, compression in COMPRESSIONS.items():
        folder = HERE / name
        shutil.rmtree(folder, ignore_errors=True)
        with streaming.MDSWriter(out=str(folder), columns=COLUMNS, compression=compression,
                                 size_limit=SIZE_LIMIT) as writer:
            for r in recs:
                writer.write(r)
        got = [{k: tagged(v) for k, v in s.items()} for s in read_back(streaming, folder)]
        # float16/32 columns come back rounded: compare those through the column's dtype
        for g, w in zip(got, want, strict=True):
            for k in ("f16", "f32"):
                w = dict(w, **{k: float(np.dtype(COLUMNS[k]).type(w[k]))})
            assert g == w, (name, g, w)
        files = sorted(p.name for p in folder.iterdir())
        print(f"{name}: {files}")
    doc = {
        "written_by": f"mosaicml-streaming {streaming.__version__} MDSWriter",
        "read_by": "its reader_from_json(...).decode_sample(get_sample_data(i)), per shard",
        "environment": f"python {platform.python_version()}, numpy {np.__version__}",
        "columns": COLUMNS,
        "folders": list(COMPRESSIONS),
        "samples": got,
    }
    head = json.dumps({k: v for k, v in doc.items() if k != "samples"}, indent=1, ensure_ascii=False)
    lines = ",\n".join(json.dumps(s, ensure_ascii=False) for s in got)  # one sample a line
    (HERE / "expected.json").write_text(f'{head[:-2]},\n "samples": [\n{lines}\n ]\n}}\n')
    json.loads((HERE / "expected.json").read_text())


if __name__ == "__main__":
    main()
