"""Fault matrix, in-process part: corrupt inputs, bad values and files give typed errors naming the fix.

Each test is one row of docs/reliability.md; the cluster rows are in test_faults_cluster.py.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import zephon_dask as z
from zephon_dask.data import tokens
from zephon_dask.errors import (
    ClosedError,
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    EmptyDatasetError,
    FieldTypeError,
    RecipeTypeError,
    StateError,
    TokenizerMismatchError,
    ZephonWarning,
)

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


# -- token ids against the vocabulary ---------------------------------------------------

BYTES = {"tokenizer": {"kind": "bytes", "version": 1}}  # what a byte-tokenizer store records


def test_store_of_another_vocabulary_is_refused_at_construction(tmp_path):
    tokens.write_token_store(str(tmp_path / "big"), {"a": [np.array([1, 2, 65000])]}, BYTES)
    with pytest.raises(TokenizerMismatchError, match=r"up to 65000.*\[0, 258\)"):
        z.Dataset.from_tokens("t", str(tmp_path / "big"), tokenizer=z.Tokenize("bytes"))
    assert z.Dataset.from_tokens("t", str(tmp_path / "big")).vocab_size is None  # unknown: unchecked
    tokens.write_token_store(str(tmp_path / "v"), {"a": [np.array([1, 2])]}, BYTES, vocab_size=50_257)
    with pytest.raises(TokenizerMismatchError, match="50257"):
        z.Dataset.from_tokens("t", str(tmp_path / "v"), tokenizer=z.Tokenize("bytes"))
    with pytest.raises(ConfigError, match=r"token id 300 is outside the vocabulary \[0, 258\)"):
        tokens.write_token_store(str(tmp_path / "w"), {"a": [np.array([300])]}, BYTES, vocab_size=258)
    zarr.open_group(str(tmp_path / "v"), mode="r+").attrs.update({"vocab_size": 258, "max_id": 300})
    with pytest.raises(DataFormatError, match="prepare_tokens"):  # the store contradicts itself
        z.Dataset.from_tokens("t", str(tmp_path / "v"))


@pytest.mark.parametrize("given", ["tokenizer", "recorded"])
def test_token_ids_outside_the_vocabulary_on_read_name_the_chunk_file(tmp_path, monkeypatch, given):
    monkeypatch.setattr(tokens, "TOKEN_CHUNK", 64)
    _fresh()
    docs = [np.arange(i % 7, 30 + i % 7) for i in range(20)]  # 30 ids each, all < 258
    path = tmp_path / "store"
    tokens.write_token_store(str(path), {"a": docs}, BYTES, vocab_size=None if given == "tokenizer" else 258)
    kw = {"tokenizer": z.Tokenize("bytes")} if given == "tokenizer" else {}
    ds = z.Dataset.from_tokens("t", str(path), **kw)
    assert ds.vocab_size == 258 and len(ds.read(0, np.arange(20))) == 20
    zarr.open_array(str(path / "shards/a/tokens"), mode="r+")[200] = 60_000  # document 6, chunk 3
    _fresh()
    assert ds.read(0, [5, 7])[0]["tokens"].size == 30  # documents without the bad id still read
    with pytest.raises(DataFormatError, match="prepare_tokens") as info:
        ds.read(0, np.arange(20))
    msg = str(info.value)
    assert "document 6" in msg and "60000" in msg and f"{path}/shards/a/tokens/c/3" in msg
    ws = z.MixtureWorkSource([ds], chunk_size=8, seed=0)
    with pytest.raises(ConfigError, match=r"pad_id=258.*\[0, 258\)"):
        z.Pipeline(ws).pack(32, pad_id=258)  # a pad id outside the store's vocabulary
    z.Pipeline(ws).pack(32, pad_id=257)


def test_prepared_store_records_its_vocabulary(tmp_path):
    import uuid

    import fsspec

    root = f"/zephon-faults-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    try:
        with fs.open(f"{root}/web/part-0.jsonl", "w") as fh:
            fh.write("\n".join(json.dumps({"text": f"doc {i} é"}) for i in range(10)) + "\n")
        ds = z.Dataset.from_jsonl("web", f"memory://{root}/web", progress=False)
        report = z.prepare_tokens(ds, z.Tokenize("bytes"), f"memory://{root}/store", n_workers=1,
                                  progress=False)
        attrs = zarr.open_group(f"memory://{root}/store", mode="r").attrs
        assert attrs["vocab_size"] == 258 and attrs["max_id"] == 257  # the EOS id
        assert report.dataset.vocab_size == 258
    finally:
        fs.rm(root, recursive=True)


# -- text columns of the wrong type ----------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("column, kind", [
    ([1, 2, 3], "int64"),
    ([["a"], ["b"], ["c"]], "list<"),
    ([None, None, None], "null"),
])
def test_non_string_text_column_is_refused_at_construction(tmp_path, fmt, column, kind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": column, "body": ["x", "y", "z"]})
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / f"part-0.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    with pytest.raises(FieldTypeError, match="text_field=") as info:
        z.Dataset.from_path("d", str(path.parent), progress=False, cache_dir=tmp_path / "cache")
    msg = str(info.value)
    assert str(path) in msg and "'text'" in msg and kind in msg and "'body'" in msg and ".map" in msg
    assert isinstance(info.value, TypeError)
    ds = z.Dataset.from_path("d", str(path.parent), text_field="body", progress=False,
                             cache_dir=tmp_path / "cache")
    assert ds.read(0, [2])[0]["body"] == "z"


# -- final errors on read: gone, refused, unparsable ------------------------------------------


def _dataset(tmp_path, lines: list[str]):
    folder = tmp_path / "web"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("".join(line + "\n" for line in lines))
    return z.Dataset.from_jsonl("web", str(folder), progress=False), folder / "part-0.jsonl"


def test_a_deleted_shard_is_a_final_dataset_not_found_error(tmp_path):
    from zephon_dask.execution.task_errors import is_final

    ds, path = _dataset(tmp_path, ['{"text": "a"}', '{"text": "b"}'])
    path.unlink()
    with pytest.raises(DatasetNotFoundError, match="part-0.jsonl") as err:
        ds.read(0, [1])
    assert is_final(err.value)  # never retried by Dask: it travels back as the task's value


def test_an_unreadable_shard_is_a_final_typed_access_error(tmp_path, monkeypatch):
    from zephon_dask.data import integrity
    from zephon_dask.errors import DataAccessError, StorageAccessError, StorageError
    from zephon_dask.execution.task_errors import is_final

    ds, path = _dataset(tmp_path, ['{"text": "a"}', '{"text": "b"}'])
    real_open = os.open

    def denied(name, *args, **kwargs):  # chmod 000 as a user other than root
        if str(name) == str(path):
            raise PermissionError(13, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(integrity.os, "open", denied)
    with pytest.raises(DataAccessError, match="part-0.jsonl.*may not be read") as err:
        ds.read(0, [1])
    assert isinstance(err.value, PermissionError) and is_final(err.value)
    assert is_final(StorageAccessError("refused")) and not is_final(StorageError("throttled"))
    assert not is_final(OSError("a file server that may recover"))


def test_a_shard_gone_between_the_check_and_the_read_is_typed(tmp_path, monkeypatch):
    """The file vanishes after the integrity check opened it: the range read's error (which fsspec
    returns in place of the bytes) is raised typed, not sliced as if it were bytes."""
    from zephon_dask.data import integrity

    ds, path = _dataset(tmp_path, ['{"text": "a"}', '{"text": "b"}'])
    assert ds.read(0, [0]) == [{"text": "a"}]  # the file's layout is now known to this process
    monkeypatch.setattr(integrity, "verify", lambda *args, **kwargs: None)  # checked a moment ago
    path.unlink()
    with pytest.raises(DatasetNotFoundError, match="part-0.jsonl"):
        ds.read(0, [1])


def test_a_range_read_raises_the_error_fsspec_returns_in_place_of_bytes(tmp_path):
    """Every format's range reads (JSONL, Arrow, MDS, LitData) go through ``fetch_ranges``."""
    import fsspec

    from zephon_dask.data.paths import fetch_ranges

    fs = fsspec.filesystem("file")
    assert isinstance(fs.cat_ranges([str(tmp_path / "gone")], [0], [4])[0], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fetch_ranges(fs, str(tmp_path / "gone"), [0], [4])
    (tmp_path / "here").write_bytes(b"0123456789")
    assert fetch_ranges(fs, str(tmp_path / "here"), [0, 6], [2, 9]) == [b"01", b"678"]


CHMOD_000 = """
import json, os, sys
import zephon_dask as z
from zephon_dask.errors import DataAccessError
folder = sys.argv[1]
with open(os.path.join(folder, "part-0.jsonl"), "w") as fh:
    fh.write(json.dumps({"text": "a"}) + "\\n")
ds = z.Dataset.from_jsonl("web", folder, progress=False)
os.chmod(os.path.join(folder, "part-0.jsonl"), 0)
try:
    ds.read(0, [0])
except DataAccessError as exc:
    print("typed:", exc)
"""


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")),
                    reason="needs root and setpriv, to drop the capability that lets root read anything")
def test_a_chmod_000_shard_is_a_typed_access_error_for_real(tmp_path):
    import subprocess
    import sys

    folder = tmp_path / "web"
    folder.mkdir()
    done = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
                           CHMOD_000, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("typed: dataset 'web': file"), done.stdout + done.stderr[-3000:]
    assert "may not be read (Permission denied)" in done.stdout


def test_a_deeply_nested_record_is_a_data_format_error_naming_file_and_line(tmp_path):
    deep = '{"text": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    ds, _ = _dataset(tmp_path, ['{"text": "a"}', '{"text": "b"}', deep])
    assert ds.read(0, [0, 1])[1] == {"text": "b"}
    with pytest.raises(DataFormatError, match=r"part-0.jsonl: line 3 .*nested too deeply"):
        ds.read(0, [2])


# -- validation at the door ------------------------------------------------------------


def _jsonl(tmp_path, records, name="data") -> str:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    with open(folder / "part-0.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return str(folder)


def _pipeline(tmp_path, records, tokenizer="bytes", **source):
    ds = z.Dataset.from_jsonl("d", _jsonl(tmp_path, records), progress=False)
    ws = z.MixtureWorkSource([ds], chunk_size=8, seed=0, shuffle_within_shard=False, **source)
    return z.Pipeline(ws).tokenize(tokenizer, eos_id=1 if callable(tokenizer) else None).pack(16).batch(1).options(
        runner="synchronous", canonical_replicas=1)


@pytest.mark.parametrize("output, match", [
    ([0.9, 1.9, 2.99], "float64"),
    ([2**32 + 7], str(2**32 + 7)),
    ([3, -1], "-1"),
    ([[1, 2], [3, 4]], "shape"),
    ([[1, 2], [3]], "flat sequence"),
    ([True, False], "bool"),
    (["1", "2"], "<U1"),
])
def test_callable_tokenizer_output_is_checked_never_cast(tmp_path, output, match):
    records = [{"text": f"doc {i}"} for i in range(8)]
    p = _pipeline(tmp_path, records, tokenizer=lambda t: output if t == "doc 5" else [1, 2])
    with pytest.raises(ConfigError, match=match) as info, p:
        list(p)
    assert "offset 5" in str(info.value)  # the record at fault, not the chunk's first


def test_special_and_pad_ids_are_checked_against_the_vocabulary(tmp_path):
    p = _pipeline(tmp_path, [{"text": "a"}])
    pipe = z.Pipeline(p.spec.source)
    with pytest.raises(ConfigError, match="eos_id=-7"):
        pipe.tokenize("bytes", eos_id=-7)
    with pytest.raises(ConfigError, match=r"bos_id=True"):
        pipe.tokenize("bytes", bos=True, bos_id=True)
    with pytest.raises(ConfigError, match=r"\[0, 258\)"):
        pipe.tokenize("bytes", eos_id=258)
    with pytest.raises(ConfigError, match="pad_id=1000000"):
        z.Pipeline(p.spec.source).tokenize("bytes").pack(16, pad_id=10**6)
    z.Pipeline(p.spec.source).tokenize("bytes").pack(16, pad_id=257)


@pytest.mark.parametrize("value", [7, None, ["a", "b"], {"t": 1}])
def test_text_field_of_the_wrong_type_names_the_exact_record(tmp_path, value):
    records = [{"text": f"doc {i}"} for i in range(8)]
    records[6]["text"] = value
    p = _pipeline(tmp_path, records)
    with pytest.raises(FieldTypeError, match="offset 6") as info, p:
        list(p)
    assert isinstance(info.value, TypeError) and "not a string" in str(info.value)


def test_lone_surrogate_names_the_record_and_survives_pickling(tmp_path):
    records = [{"text": f"doc {i}"} for i in range(8)]
    folder = _jsonl(tmp_path, records)
    with open(Path(folder) / "part-0.jsonl", "a") as fh:
        fh.write('{"text": "bad \\ud800 text"}\n')
    ds = z.Dataset.from_jsonl("d", folder, progress=False)
    ws = z.MixtureWorkSource([ds], chunk_size=9, seed=0, shuffle_within_shard=False)
    p = z.Pipeline(ws).tokenize().pack(16).batch(1).options(runner="synchronous", canonical_replicas=1)
    with pytest.raises(DataFormatError, match="offset 8") as info, p:
        list(p)
    again = pickle.loads(pickle.dumps(info.value))  # what the distributed runner sends back
    assert "not valid Unicode" in str(again) and "offset 8" in str(again)


def test_filter_dropping_everything_on_a_repeating_source_stops(tmp_path):
    p = _pipeline(tmp_path, [{"text": f"doc {i}"} for i in range(8)], exhausted_policy="repeat")
    p = z.Pipeline(p.spec.source).filter(lambda r: False).tokenize().pack(16).batch(1).options(
        runner="synchronous", canonical_replicas=1, flush_every_k_chunks=1)
    with pytest.raises(EmptyDatasetError, match="no sample") as info, p:
        next(iter(p))
    assert "filter.dropped" in str(info.value) or "dropped" in str(info.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"chunk_size": 10**12}, "too large"),
    ({"weights": {"d": "0.5"}}, "not a string"),
])
def test_values_that_make_no_sense_are_refused(tmp_path, kwargs, match):
    ds = z.Dataset.from_jsonl("d", _jsonl(tmp_path, [{"text": "a"}]), progress=False)
    with pytest.raises(ConfigError, match=match):
        z.MixtureWorkSource([ds], **kwargs)


def test_every_recipe_option_is_type_checked(tmp_path):
    from zephon_dask.options import OPTIONS
    from zephon_dask.recipe import OPTION_TYPES, load_recipe

    assert set(OPTION_TYPES) == {o.name for o in OPTIONS} - {"client"}
    folder = _jsonl(tmp_path, [{"text": "a"}])
    path = tmp_path / "r.toml"
    path.write_text(f'[[datasets]]\nname = "d"\npath = "{folder}"\n[options]\nledger = 5\n')
    with pytest.raises(RecipeTypeError, match="ledger"):
        load_recipe(path)


# -- files: checkpoints and ledgers -----------------------------------------------------


@pytest.fixture(scope="module")
def a_state(tmp_path_factory):
    folder = tmp_path_factory.mktemp("state")
    p = _pipeline(folder, [{"text": f"doc {i}"} for i in range(20)])
    with p:
        it = iter(p)
        next(it)
        return p.state_dict()


def test_interrupted_saves_leave_no_temp_files_behind(tmp_path, a_state):
    target = tmp_path / "ckpt.json"
    stale = [tmp_path / f".ckpt.json.dead{i}.tmp" for i in range(3)]
    for f in stale:
        f.write_text("{partial")
        os.utime(f, (0, 0))  # left by saves killed long ago
    fresh = tmp_path / ".ckpt.json.live.tmp"  # a save running right now
    fresh.write_text("{")
    z.save_state(target, a_state)
    assert not any(f.exists() for f in stale) and fresh.exists()
    assert z.load_state(target) == a_state


def test_symlink_is_written_through(tmp_path, a_state):
    real = tmp_path / "real" / "data.json"
    real.parent.mkdir()
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    z.save_state(link, a_state)
    assert link.is_symlink() and real.is_file()
    assert z.load_state(link) == a_state


def _full_disk(monkeypatch, tmp_path):
    """Make the next checkpoint's temp file a handle on ``/dev/full``: its writes fail with ENOSPC."""
    import tempfile

    from zephon_dask.state import files

    real = tempfile.mkstemp

    def on_full_disk(prefix, suffix, dir):
        fd, name = real(prefix=prefix, suffix=suffix, dir=dir)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr(files.tempfile, "mkstemp", on_full_disk)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_checkpoint_is_a_state_error_keeping_the_previous(tmp_path, a_state, monkeypatch):
    target = tmp_path / "ckpt.json"
    z.save_state(target, a_state)
    before = target.read_bytes()
    _full_disk(monkeypatch, tmp_path)
    with pytest.raises(StateError) as err:
        z.save_state(target, a_state)
    message = str(err.value)
    assert str(target) in message and "No space left on device" in message
    assert "previous checkpoint there is intact" in message
    assert target.read_bytes() == before and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_cli_run_full_disk_checkpoint_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from zephon_dask.cli import main

    folder = _jsonl(tmp_path, [{"text": f"doc {i}"} for i in range(20)])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "d"\npath = "{folder}"\n[tokenize]\ntokenizer = "bytes"\n'
                      '[pack]\nmax_length = 16\n[batch]\nmicrobatch_size = 1\n[options]\n'
                      'runner = "synchronous"\ndrop_last_step = false\n')  # lanes of one batch or none
    _full_disk(monkeypatch, tmp_path)
    assert main(["run", str(recipe), "--steps", "1", "--checkpoint", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(errors) == 1, err
    assert "checkpoint" in errors[0] and "No space left" in errors[0]


def test_checkpoint_folder_is_synced_after_the_rename(tmp_path, a_state, monkeypatch):
    import stat

    from zephon_dask.state import files

    synced, real_fsync = [], os.fsync
    def fsync(fd):
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), (tmp_path / "ckpt.json").exists()))
        real_fsync(fd)
    monkeypatch.setattr(files.os, "fsync", fsync)
    z.save_state(tmp_path / "ckpt.json", a_state)
    assert synced[-1] == (True, True)  # the folder, once the file is renamed into it


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_non_regular_checkpoint_targets_are_refused(tmp_path, a_state, kind):
    target = tmp_path / "ckpt"
    target.mkdir() if kind == "directory" else os.mkfifo(target)
    with pytest.raises(StateError, match="cannot write a checkpoint"):
        z.save_state(target, a_state)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("content", ["directory", b"\x89PNG\r\n\x1a\n\x00\xff"])
def test_directory_or_binary_checkpoints_are_state_errors(tmp_path, content):
    path = tmp_path / "ckpt.json"
    path.mkdir() if content == "directory" else path.write_bytes(content)
    with pytest.raises(StateError, match="directory|binary"):
        z.load_state(path)


def test_cli_run_exits_2_for_a_bad_checkpoint_or_ledger(tmp_path):
    from zephon_dask.cli import main

    folder = _jsonl(tmp_path, [{"text": f"doc {i}"} for i in range(20)])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "d"\npath = "{folder}"\n[tokenize]\ntokenizer = "bytes"\n'
                      '[pack]\nmax_length = 16\n[batch]\nmicrobatch_size = 1\n[options]\n'
                      'runner = "synchronous"\ncanonical_replicas = 1\n')  # a step of one batch
    assert main(["run", str(recipe), "--steps", "1"]) == 0  # the recipe runs: the refusals below are the paths'
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "bin.json").write_bytes(b"\x00\xff\xfe")
    ledger_file = tmp_path / "ledger-file"
    ledger_file.write_text("x")
    assert main(["run", str(recipe), "--steps", "1", "--resume", str(tmp_path / "dir.json")]) == 2
    assert main(["run", str(recipe), "--steps", "1", "--resume", str(tmp_path / "bin.json")]) == 2
    assert main(["run", str(recipe), "--steps", "1", "--ledger", str(ledger_file)]) == 2


def test_cli_run_keeps_data_errors_and_bugs_apart_from_the_end_of_the_stream(tmp_path, monkeypatch, capsys):
    from zephon_dask.cli import main

    deep = '{"text": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    folder = _jsonl(tmp_path, [{"text": f"doc {i}"} for i in range(4)])
    with open(Path(folder) / "part-0.jsonl", "a") as fh:
        fh.write(deep + "\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "d"\npath = "{folder}"\n[tokenize]\ntokenizer = "bytes"\n'
                      '[pack]\nmax_length = 16\n[batch]\nmicrobatch_size = 1\n[options]\n'
                      'runner = "synchronous"\ncanonical_replicas = 1\n')
    assert main(["run", str(recipe), "--steps", "1000"]) == 2  # was a raw RecursionError, exit 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "part-0.jsonl: line 5" in err and "nested too deeply" in err, err

    def bug(cls, path):
        raise KeyError("body")

    monkeypatch.setattr(z.Pipeline, "from_config", classmethod(bug))
    assert main(["run", str(recipe), "--steps", "1"]) == 3
    err = capsys.readouterr().err
    assert "KeyError: 'body'" in err and err.strip().endswith("stopped by the unexpected error above"), err


def test_ledger_torn_last_line_is_repaired_before_appending(tmp_path):
    from zephon_dask.state.ledger import LedgerWriter, read_ledger

    w = LedgerWriter(tmp_path, 0)
    w.write(0, 0, 0, np.zeros((1, 4)))
    w.close()
    path = tmp_path / "rank-0.jsonl"
    path.write_text(path.read_text() + '{"global_step": 1, "lane": 0, "ind')  # killed mid-write
    with pytest.warns(ZephonWarning, match="cut short"):
        w = LedgerWriter(tmp_path, 0)
    w.write(1, 0, 1, np.ones((1, 4)))
    w.close()
    assert sorted(read_ledger(tmp_path)) == [0, 1]


def test_ledger_paths_that_are_not_folders_or_files(tmp_path):
    from zephon_dask.state.ledger import LedgerWriter, read_ledger

    (tmp_path / "f").write_text("x")
    with pytest.raises(StateError, match="is a file"):
        LedgerWriter(tmp_path / "f", 0)
    (tmp_path / "d" / "rank-0.jsonl").mkdir(parents=True)
    with pytest.raises(StateError, match="is a directory"):
        LedgerWriter(tmp_path / "d", 0)
    with pytest.raises(StateError, match="directory"):
        read_ledger(tmp_path / "d")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank-0.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StateError, match="binary"):
        read_ledger(tmp_path / "b")


def test_verify_reports_missing_steps_in_the_middle(tmp_path):
    from zephon_dask.state.ledger import LedgerWriter, verify_ledgers

    for name, steps in (("a", range(10)), ("b", [*range(5), *range(7, 10)])):
        w = LedgerWriter(tmp_path / name, 0)
        for s in steps:
            w.write(s, 0, s, np.full((1, 2), s))
        w.close()
    same, report = verify_ledgers(tmp_path / "a", tmp_path / "b")
    assert not same and "lacks global steps 5..6" in report


def _ledger(folder, batches) -> None:
    from zephon_dask.state.ledger import LedgerWriter

    w = LedgerWriter(folder, 0)
    for step, lane, value in batches:
        w.write(step, lane, step, np.full((1, 2), value))
    w.close()


def test_verify_compares_complete_steps_and_reports_a_trailing_partial_one(tmp_path, capsys):
    from zephon_dask.cli import main

    whole = [(s, lane, 10 * s + lane) for s in range(6) for lane in range(4)]
    _ledger(tmp_path / "a", whole)
    _ledger(tmp_path / "b", whole[:4 * 4 + 2])  # stopped inside step 4, after 2 of its 4 batches
    assert main(["verify", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 4 global steps (0..3), 16 batches: identical"), out
    assert "ledger B ends inside global step 4: it holds 2 of the 4 batches A holds there" in out
    assert main(["verify", str(tmp_path / "b"), str(tmp_path / "a")]) == 0
    assert "ledger A ends inside global step 4" in capsys.readouterr().out


def test_verify_still_finds_a_difference_inside_a_trailing_partial_step(tmp_path):
    from zephon_dask.state.ledger import verify_ledgers

    whole = [(s, lane, 10 * s + lane) for s in range(3) for lane in range(4)]
    _ledger(tmp_path / "a", whole)
    _ledger(tmp_path / "b", [*whole[:8], (2, 0, 99)])
    same, report = verify_ledgers(tmp_path / "a", tmp_path / "b")
    assert not same and report.startswith("global step 2 differs"), report


# -- use after close ---------------------------------------------------------------------


@pytest.mark.parametrize("runner", ["synchronous", "threads"])
def test_use_after_close_is_a_typed_error_never_a_restart(tmp_path, runner):
    p = _pipeline(tmp_path, [{"text": f"doc {i} " * 4} for i in range(40)]).options(
        runner=runner, prefetch_windows=1)
    it = iter(p)
    next(it)
    p.close()
    with pytest.raises(ClosedError, match="closed"):
        next(it)
    with pytest.raises(ClosedError, match="closed"):
        next(iter(p))
    assert p.state_dict()["format"]  # the state stays readable after close


def test_closed_runner_refuses_work(tmp_path):
    from zephon_dask.execution.local import ThreadRunner
    from zephon_dask.graph import window_graph

    p = _pipeline(tmp_path, [{"text": "a"}])
    runner = ThreadRunner(p.spec, 1)
    runner.close()
    with pytest.raises(ClosedError):
        runner.submit(window_graph(p.spec, 0, 0, True), 0)


# -- secure defaults ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escape/prose", "/abs/prose", "a/../../b", "a//b", ".", "c:\\x", "a\\..\\b"])
def test_prepare_refuses_names_that_leave_the_output_folder(name):
    from zephon_dask.commands.prepare import store_path

    with pytest.raises(ConfigError, match="would leave"):
        store_path("out", name)
    assert store_path("out/", "web/en") == "out/web/en"


def test_cli_prepare_writes_nothing_outside_out(tmp_path, capsys):
    from zephon_dask.cli import main

    folder = _jsonl(tmp_path, [{"text": "a"}])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[datasets]]\nname = "../escape"\npath = "{folder}"\n')
    assert main(["prepare", str(recipe), "--out", str(tmp_path / "out")]) == 2
    assert "would leave" in capsys.readouterr().err
    assert not (tmp_path / "escape").exists()


# -- every deliberate error is typed ----------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "zephon_dask"
BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}
# (path relative to zephon_dask/, exception name): why a built-in is right there
ALLOWED_BUILTIN_RAISES = {
    ("__init__.py", "AttributeError"): "module __getattr__: the protocol asks for AttributeError",
    ("cli.py", "SystemExit"): "the console entry point exits with main()'s status",
    ("consumer/stream.py", "StopIteration"): "__next__ at the end of the stream: the iterator protocol",
    ("execution/base.py", "NotImplementedError"): "an abstract method of the runner base class",
    ("operators/base.py", "NotImplementedError"): "abstract methods of the operator base classes",
    ("data/formats.py", "TypeError"): "a format module whose READER is not a Reader: the library's own "
                                      "mistake, found when the registry is imported",
    ("data/litdata.py", "ValueError"): "the nested-value decoder's failure, caught by its caller and raised "
                                       "as a DataFormatError naming the chunk",
    ("operators/table.py", "ValueError"): "a sample whose document ids outnumber its lineage rows, caught by "
                                          "the batch cut and raised as a DataFormatError",
}


def builtin_raises():
    """``(path, line, name)`` of each ``raise Name(...)`` / ``raise Name`` of a built-in exception."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in BUILTIN_ERRORS:
                    yield path.relative_to(PACKAGE).as_posix(), node.lineno, target.id


def test_deliberate_errors_are_typed():
    """errors.py: every error raised on purpose subclasses ZephonError (and the matching built-in)."""
    found = list(builtin_raises())
    bare = [f"zephon_dask/{path}:{line}: raise {name}" for path, line, name in found
            if (path, name) not in ALLOWED_BUILTIN_RAISES]
    assert not bare, "raise a class from zephon_dask/errors.py instead:\n" + "\n".join(bare)
    stale = set(ALLOWED_BUILTIN_RAISES) - {(path, name) for path, _, name in found}
    assert not stale, f"allowed raises no longer in the source (drop them from the list): {stale}"
