"""litData folders written by ``litdata.optimize`` itself, read back equal to the rows it was given.

Three folders: rows of plain fields (litData stores them with an Arrow footer), rows with
token-id arrays (its per-leaf encoding: ``no_header_numpy``, ``numpy``, ``bytes``, ``bool``)
and the same compressed whole with zstd; each read in place, from disk and from a real S3
server, found by ``from_path`` and by a recipe, checked on every read, and run through a
pipeline resumed on other data-parallel degrees.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import elastic
from zephon_dask.data import Dataset
from zephon_dask.data import litdata as lit
from zephon_dask.errors import (
    DataChangedError,
    DataFormatError,
    DatasetNotFoundError,
    FieldTypeError,
    MissingFieldError,
    StorageAccessError,
)

litdata = pytest.importorskip("litdata")

WORDS = "the cat sat on a mat while dogs ran far away é ü 字".split()
CASES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _text(i: int) -> str:
    rng = np.random.default_rng(i)
    return f"doc {i} " + " ".join(rng.choice(WORDS, int(rng.integers(0, 40))))


def plain(i: int) -> dict:
    return {"text": _text(i), "id": i * 7919 - 3, "score": i / 7}


def tokens(i: int) -> dict:
    rng = np.random.default_rng(1000 + i)
    return {"text": _text(i), "tokens": rng.integers(0, 60_000, int(rng.integers(1, 30))).astype(np.uint16),
            "grid": rng.random((2, 3)).astype(np.float32), "raw": bytes(rng.integers(0, 256, i % 9).astype(np.uint8)),
            "keep": bool(i % 2), "id": i,
            "meta": {"source": f"s{i % 3}", "pos": [i, -i], "spans": [{"a": i, "b": "x", "c": None}] * (i % 2),
                     "words": ["a", "é"][: i % 3], "odd": [1, "two", 3.0, True, None]}}


ROWS = {"plain": (plain, 120, {}), "tokens": (tokens, 90, {}),
        "zstd": (tokens, 70, {"compression": "zstd", "compression_batch_size": 4}),  # frames of rows
        "zstd-file": (tokens, 40, {"compression": "zstd", "compression_level": "chunk"}),
        "zstd-row": (tokens, 30, {"compression": "zstd", "compression_level": "sample"})}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("litdata")
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        for name, (fn, n, kw) in ROWS.items():
            litdata.optimize(fn=fn, inputs=list(range(n)), output_dir=str(root / name), chunk_bytes=1500,
                             num_workers=1, **kw)
    finally:  # optimize() sets the process's start method ("spawn") for every later test
        multiprocessing.set_start_method(method, force=True)
    return root


def expected(name: str) -> list[dict]:
    fn, n, _ = ROWS[name]
    return [fn(i) for i in range(n)]


def same(got: dict, want: dict) -> bool:
    if list(got) != list(want):
        return False
    for k, v in want.items():
        g = got[k]
        if isinstance(v, np.ndarray):
            if not (isinstance(g, np.ndarray) and g.dtype == v.dtype and g.tobytes() == v.tobytes()
                    and g.shape == v.shape):
                return False
        elif type(g) is not type(v) or g != v:
            return False
    return True


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, range(n))]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_rows_read_back_exactly_as_optimize_was_given_them(folders, name):
    ds = Dataset.from_litdata(name, folders / name)
    want = expected(name)
    assert ds.format == "litdata" and ds.num_shards > 2 and ds.num_samples == len(want)
    got = everything(ds)
    assert all(same(g, w) for g, w in zip(got, want, strict=True))
    index = json.loads((folders / name / "index.json").read_text())
    assert [s.shard_id for s in ds.shards] == [c["filename"] for c in index["chunks"]]
    if name in ("plain", "tokens"):  # plain fields: litData appends its Arrow footer; arrays: leaves only
        assert all((lit.OFFSETS[s][1] is not None) == (name == "plain") for s in ds.shards)


@CASES
@given(data=st.data())
def test_any_offsets_in_any_order_read_the_rows_there(folders, data):
    name = data.draw(st.sampled_from(sorted(ROWS)))
    ds = Dataset.from_litdata(name, folders / name)
    want = expected(name)
    starts = np.concatenate(([0], np.cumsum(ds.shard_sizes)))
    shard = data.draw(st.integers(0, ds.num_shards - 1))
    offsets = data.draw(st.lists(st.integers(0, ds.shard_sizes[shard] - 1), max_size=12))
    got = ds.read(shard, offsets)
    assert all(same(g, want[starts[shard] + o]) for g, o in zip(got, offsets, strict=True))
    assert len({id(r) for r in got}) == len(got)  # fresh objects, repeats too


def test_found_by_from_path_and_by_a_recipe(folders, tmp_path):
    from zephon_dask.recipe import load_recipe

    found = Dataset.from_path("p", folders / "plain")
    assert found.format == "litdata" and found.identity() == Dataset.from_litdata("p", folders / "plain").identity()
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "p"\npath = "{folders / "plain"}"\nformat = "litdata"\n\n'
                      f'[[datasets]]\nname = "t"\npath = "{folders / "tokens"}"\n')
    spec = load_recipe(recipe)
    built = [d.open() for d in spec.datasets]
    assert [d.format for d in built] == ["litdata", "litdata"]


def test_a_chunk_changed_under_a_run_is_refused(folders, tmp_path):
    folder = shutil.copytree(folders / "tokens", tmp_path / "t")
    ds = Dataset.from_litdata("t", folder)
    assert ds.read(1, [0])
    chunk = folder / ds.shards[1].shard_id
    os.utime(chunk, ns=(0, chunk.stat().st_mtime_ns + 10**9))  # touched: the same bytes read on
    assert ds.read(1, [0])
    data = bytearray(chunk.read_bytes())
    data[-3] ^= 0xFF  # same size, other bytes
    chunk.write_bytes(bytes(data))
    with pytest.raises(DataChangedError, match=ds.shards[1].shard_id):
        ds.read(1, [0])
    chunk.unlink()
    with pytest.raises(DatasetNotFoundError, match="no longer exists"):
        ds.read(1, [0])


def test_missing_and_damaged_folders_are_typed_errors(folders, tmp_path):
    with pytest.raises(DatasetNotFoundError, match="has no index.json"):
        Dataset.from_litdata("x", tmp_path)
    folder = shutil.copytree(folders / "plain", tmp_path / "p")
    with pytest.raises(MissingFieldError, match="content"):
        Dataset.from_litdata("x", folder, text_field="content")
    with pytest.raises(FieldTypeError, match="'id' is 'int'"):
        Dataset.from_litdata("x", folder, text_field="id")
    index = json.loads((folder / "index.json").read_text())
    first = folder / index["chunks"][0]["filename"]
    first.write_bytes(first.read_bytes()[:-5])
    with pytest.raises(DataFormatError, match="truncated"):
        Dataset.from_litdata("x", folder)
    first.unlink()
    with pytest.raises(DataFormatError, match="is not in the folder"):
        Dataset.from_litdata("x", folder)
    for key, value in (("item_loader", "TokensLoader"), ("encryption", {"key": "k"}),
                       ("data_format", ["str", "int", "pickle"])):
        bad = json.loads(json.dumps(index))
        bad["config"][key] = value
        (folder / "index.json").write_text(json.dumps(bad))
        with pytest.raises(DataFormatError, match=key if key != "data_format" else "pickle"):
            Dataset.from_litdata("x", folder)


def test_a_damaged_chunk_header_is_a_data_format_error(folders, tmp_path):
    folder = shutil.copytree(folders / "tokens", tmp_path / "t")
    chunk = folder / json.loads((folder / "index.json").read_text())["chunks"][0]["filename"]
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0x01  # the row count
    chunk.write_bytes(bytes(data))
    ds = Dataset.from_litdata("t", folder)
    with pytest.raises(DataFormatError, match="header"):
        ds.read(0, [0])


def test_read_from_a_bucket_as_from_disk(folders):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.helpers.s3server import S3Server

    with S3Server() as s3:
        fs = s3.filesystem()
        fs.mkdir("lit")
        fs.put(str(folders) + "/", "lit/", recursive=True)
        for name in ROWS:
            remote = Dataset.from_path(name, f"s3://lit/{name}", storage_options=s3.options())
            assert remote.format == "litdata" and remote.shard_sizes == Dataset.from_litdata(
                name, folders / name).shard_sizes
            got = everything(remote)
            assert all(same(g, w) for g, w in zip(got, expected(name), strict=True))
        remote = Dataset.from_litdata("t", "s3://lit/tokens", storage_options=s3.options())
        key = f"lit/tokens/{remote.shards[0].shard_id}"
        fs.pipe(key, fs.cat(key)[:-1] + b"x")  # rewritten under a run: a new ETag
        with pytest.raises(DataChangedError, match="ETag"):
            remote.read(0, [0])
        s3.set_auth(0)
        try:
            with pytest.raises(StorageAccessError, match="credentials") as refused:
                Dataset.from_litdata("t", "s3://lit/tokens", storage_options=dict(s3.options(), secret="wrong"))
            assert "wrong" not in str(refused.value)
        finally:
            s3.set_auth(float("inf"))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 5), before=st.sampled_from([1, 2, 4]), after=st.sampled_from([1, 2, 4]))
def test_a_run_resumed_on_another_dp_degree_equals_the_single_rank_run(folders, cut, before, after):
    ds = Dataset.from_litdata("tokens", folders / "tokens")
    truth = elastic.steps(elastic.pipes(ds, 1), 6)
    assert sum(truth[-1].values())  # the last step still delivers rows
    assert elastic.resumed(ds, 6, cut, before, after) == truth
