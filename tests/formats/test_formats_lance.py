"""Lance datasets written by ``lance.write_dataset`` itself, read back equal to the rows it was given.

Several fragments (``max_rows_per_file``), appends and deletions (new versions: a Dataset
keeps reading the version it was built on), found by ``from_path`` and by a recipe,
checked on every read, and run through a pipeline resumed on other data-parallel degrees.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import elastic
from zephon_dask.data import Dataset
from zephon_dask.errors import (
    ConfigError,
    DataChangedError,
    DataFormatError,
    DatasetNotFoundError,
    FieldTypeError,
    MissingFieldError,
    StorageAccessError,
)

lance = pytest.importorskip("lance")

WORDS = "the cat sat on a mat while dogs ran far away é ü 字".split()
CASES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def rows(lo: int, hi: int) -> list[dict]:
    out = []
    for i in range(lo, hi):
        rng = np.random.default_rng(i)
        out.append({"text": f"doc {i} " + " ".join(rng.choice(WORDS, int(rng.integers(0, 40)))),
                    "id": i * 7919 - 3, "score": i / 7,
                    "tokens": rng.integers(0, 60_000, int(rng.integers(0, 20))).tolist(),
                    "raw": bytes(rng.integers(0, 256, i % 9).astype(np.uint8))})
    return out


SCHEMA = pa.schema([("text", pa.string()), ("id", pa.int64()), ("score", pa.float64()),
                    ("tokens", pa.list_(pa.int32())), ("raw", pa.binary())])


def write(path, recs, **kw):
    return lance.write_dataset(pa.Table.from_pylist(recs, schema=SCHEMA), str(path), **kw)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("lance") / "web.lance"
    write(path, rows(0, 150), max_rows_per_file=40)
    return path


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, range(n))]


def test_rows_read_back_exactly_as_written(store):
    ds = Dataset.from_lance("web", store)
    assert ds.format == "lance" and ds.shard_sizes == (40, 40, 40, 30)
    assert everything(ds) == rows(0, 150)
    assert [type(v) for v in everything(ds)[7].values()] == [str, int, float, list, bytes]


@CASES
@given(data=st.data())
def test_any_offsets_in_any_order_read_the_rows_there(store, data):
    ds = Dataset.from_lance("web", store)
    want = rows(0, 150)
    shard = data.draw(st.integers(0, ds.num_shards - 1))
    offsets = data.draw(st.lists(st.integers(0, ds.shard_sizes[shard] - 1), max_size=12))
    got = ds.read(shard, offsets)
    assert got == [want[40 * shard + o] for o in offsets]
    assert len({id(r) for r in got}) == len(got)
    assert len({id(r["tokens"]) for r in got}) == len(got)  # fresh objects, repeats too


def test_later_versions_change_nothing_a_built_dataset_reads(store, tmp_path):
    path = shutil.copytree(store, tmp_path / "w.lance")
    ds = Dataset.from_lance("web", path)
    write(path, rows(150, 170), mode="append")
    lance.dataset(str(path)).delete("id % 2 = 0")
    assert everything(ds) == rows(0, 150)  # the version it was built on
    now = Dataset.from_lance("web", path)
    assert now.identity() != ds.identity()
    assert everything(now) == [r for r in rows(0, 170) if r["id"] % 2]  # deleted rows are gone
    assert now.num_samples == sum(1 for r in rows(0, 170) if r["id"] % 2)


def test_found_by_from_path_and_by_a_recipe(store, tmp_path):
    from zephon_dask.recipe import load_recipe

    found = Dataset.from_path("web", store)
    assert found.format == "lance" and found.identity() == Dataset.from_lance("web", store).identity()
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "a"\npath = "{store}"\nformat = "lance"\n\n'
                      f'[[datasets]]\nname = "b"\npath = "{store}"\n')
    assert [d.open().format for d in load_recipe(recipe).datasets] == ["lance", "lance"]


def test_a_data_file_changed_under_a_run_is_refused(store, tmp_path):
    path = shutil.copytree(store, tmp_path / "w.lance")
    ds = Dataset.from_lance("web", path)
    assert ds.read(2, [0])
    data_file = ds.shards[2].path
    blob = bytearray(open(data_file, "rb").read())
    blob[100] ^= 0xFF
    open(data_file, "wb").write(bytes(blob))
    with pytest.raises(DataChangedError, match="changed since it was indexed"):
        ds.read(2, [0])
    shutil.rmtree(path / "data")
    with pytest.raises(DatasetNotFoundError, match="no longer exists"):
        ds.read(2, [0])


def test_missing_and_refused_datasets_are_typed_errors(store, tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        Dataset.from_lance("x", tmp_path / "nothing.lance")
    with pytest.raises(MissingFieldError, match="content"):
        Dataset.from_lance("x", store, text_field="content")
    with pytest.raises(FieldTypeError, match="'id' is 'int64'"):
        Dataset.from_lance("x", store, text_field="id")
    with pytest.raises(ConfigError, match="local paths and s3:// URLs"):
        Dataset.from_lance("x", "memory://somewhere/web.lance")
    with pytest.raises(ConfigError, match="node_cache"):
        Dataset.from_lance("x", store, storage_options={"node_cache": {"max_bytes": 1 << 20}})
    path = shutil.copytree(store, tmp_path / "w.lance")
    first = sorted((path / "data").iterdir())[0]
    first.unlink()
    with pytest.raises(DataFormatError, match="missing"):
        Dataset.from_lance("x", path)


# the moto server's Popen forks (preexec_fn) after Lance started its threads; the child execs at once
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_read_from_a_bucket_as_from_disk(store):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.helpers.s3server import S3Server

    with S3Server() as s3:
        fs = s3.filesystem()
        fs.mkdir("lance")
        fs.put(str(store) + "/", "lance/web.lance/", recursive=True)
        remote = Dataset.from_path("web", "s3://lance/web.lance", storage_options=s3.options())
        here = Dataset.from_lance("web", store)
        assert remote.format == "lance" and remote.identity() == here.identity()
        assert everything(remote) == rows(0, 150)
        assert "secret" not in repr(remote) + json.dumps(remote.meta)
        # an object rewritten under a run: a new ETag
        key = remote.shards[1].path.removeprefix("s3://")
        fs.pipe(key, fs.cat(key)[:-1] + b"x")
        with pytest.raises(DataChangedError, match="ETag"):
            remote.read(1, [0])
        bad = dict(s3.options(), secret="wrong")
        s3.set_auth(0)
        try:
            with pytest.raises(StorageAccessError, match="credentials") as refused:
                Dataset.from_lance("web", "s3://lance/web.lance", storage_options=bad)
            assert "wrong" not in str(refused.value) and s3.options()["secret"] not in str(refused.value)
        finally:
            s3.set_auth(float("inf"))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 5), before=st.sampled_from([1, 2, 4]), after=st.sampled_from([1, 2, 4]))
def test_a_run_resumed_on_another_dp_degree_equals_the_single_rank_run(store, cut, before, after):
    ds = Dataset.from_lance("web", store)
    truth = elastic.steps(elastic.pipes(ds, 1), 6)
    assert sum(truth[-1].values())  # the last step still delivers rows
    assert elastic.resumed(ds, 6, cut, before, after) == truth
