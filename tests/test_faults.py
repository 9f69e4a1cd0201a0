"""Fault matrix, in-process part: corrupt inputs, bad values and files give typed errors naming the fix.

Each test is one row of docs/reliability.md; the cluster rows are in test_faults_cluster.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr

import zephon_dask as z
from zephon_dask.data import tokens
from zephon_dask.errors import DataFormatError, DatasetNotFoundError

pytestmark = pytest.mark.timeout(120)


# -- integrity on read: token stores ------------------------------------------------------


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """A two-shard token store with several token chunks per shard."""
    monkeypatch.setattr(tokens, "TOKEN_CHUNK", 64)
    rng = np.random.default_rng(0)
    docs = {sid: [rng.integers(0, 250, rng.integers(1, 50)) for _ in range(40)] for sid in ("a", "b")}
    path = tmp_path / "store"
    tokens.write_token_store(str(path), docs)
    return path


def _read_all(path: Path):
    ds = z.Dataset.from_tokens("t", str(path))
    return [ds.read(s, np.arange(40)) for s in range(2)]


def _fresh():
    tokens.OPENED.clear()  # shards are checked once per process: forget the earlier checks


def test_intact_store_reads(store):
    _fresh()
    assert len(_read_all(store)[1]) == 40


def test_deleted_chunk_is_an_error_naming_the_file_never_zeros(store):
    _fresh()
    victim = store / "shards/a/tokens/c/3"
    victim.unlink()
    with pytest.raises(DataFormatError, match="prepare_tokens") as info:
        _read_all(store)
    assert str(victim) in str(info.value)


def test_deleted_chunk_through_a_pipeline(store):
    _fresh()
    (store / "shards/b/tokens/c/1").unlink()
    ws = z.MixtureWorkSource([z.Dataset.from_tokens("t", str(store))], chunk_size=8, seed=1)
    p = z.Pipeline(ws).pack(32).batch(2).options(runner="synchronous", canonical_replicas=2)
    with pytest.raises(DataFormatError, match="missing"), p:
        list(p)


def test_corrupt_chunk_bytes_are_a_data_format_error(store):
    _fresh()
    chunk = store / "shards/a/tokens/c/2"
    chunk.write_bytes(os.urandom(chunk.stat().st_size))
    with pytest.raises(DataFormatError, match="cannot be decoded"):
        _read_all(store)


@pytest.mark.parametrize("where", ["zarr.json", "shards/a/zarr.json", "shards/a/tokens/zarr.json"])
def test_corrupt_metadata_is_a_data_format_error(store, where):
    _fresh()
    (store / where).write_text("{not json")
    with pytest.raises(DataFormatError):
        _read_all(store)


def test_stale_index_is_a_data_format_error(store):
    _fresh()
    ds = z.Dataset.from_tokens("t", str(store))
    tokens.write_token_store(str(store), {"a": [np.arange(3)] * 5, "b": [np.arange(3)] * 5})
    _fresh()
    with pytest.raises(DataFormatError, match="changed since the Dataset was built"):
        ds.read(0, np.arange(40))


def test_record_mismatch_and_verify_store(store):
    _fresh()
    assert tokens.verify_store(str(store)) == 2  # no completion record: nothing to hash against
    group = zarr.open_group(str(store / "shards/a"), mode="r+")
    tok = zarr.open_array(str(store / "shards/a/tokens"), mode="r")
    off = zarr.open_array(str(store / "shards/a/offsets"), mode="r")[:]
    import hashlib

    good = {"num_docs": 40, "num_tokens": int(tok.shape[0]),
            "offsets_sha256": hashlib.sha256(off.astype("<i8").tobytes()).hexdigest(),
            "tokens_sha256": hashlib.sha256(np.asarray(tok[:], "<u2").tobytes()).hexdigest()}
    group.attrs.update({tokens.RECORD: good})
    _fresh()
    assert tokens.verify_store(str(store)) == 2
    group.attrs.update({tokens.RECORD: {**good, "tokens_sha256": "0" * 64}})
    _fresh()
    with pytest.raises(DataFormatError, match="tokens_sha256"):
        tokens.verify_store(str(store))
    group.attrs.update({tokens.RECORD: {**good, "num_tokens": good["num_tokens"] + 1}})
    _fresh()
    with pytest.raises(DataFormatError, match="completion record"):
        _read_all(store)


def test_deleted_shard_folder_is_not_found(store):
    _fresh()
    ds = z.Dataset.from_tokens("t", str(store))
    import shutil

    shutil.rmtree(store / "shards/a")
    with pytest.raises((DatasetNotFoundError, DataFormatError), match="prepare_tokens"):
        ds.read(0, np.arange(3))
