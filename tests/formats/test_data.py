"""Tests of zephon_dask.data: reads against slow oracles, the index cache, errors, pickling."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import tempfile
import uuid
import warnings
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_dask.data import Dataset, Shard, check_unique_names, write_token_store
from zephon_dask.data import formats as formats_mod
from zephon_dask.data import index as index_mod
from zephon_dask.data import jsonl as jsonl_mod
from zephon_dask.data import tokens as tokens_mod
from zephon_dask.data.paths import list_files
from zephon_dask.errors import (
    ArgumentTypeError,
    ConfigError,
    DataFormatError,
    DatasetNotFoundError,
    DuplicateNameError,
    EmptyDatasetError,
    MissingFieldError,
    RecordIndexError,
    ZephonError,
    ZephonWarning,
)

FAST = settings(max_examples=25, deadline=None)


# ------------------------------------------------------------------ helpers
def write_jsonl(path: Path, records: list, *, noise: list[str] | None = None, end: str = "\n"):
    """Write records one per line, with optional noise lines (blank/whitespace) interleaved."""
    lines = []
    for i, r in enumerate(records):
        if noise:
            lines.append(noise[i % len(noise)])
        lines.append(json.dumps(r, ensure_ascii=False))
    path.write_text(end.join(lines) + (end if records else ""), encoding="utf-8")


def oracle_jsonl(path: Path) -> list[dict]:
    text = path.read_bytes().decode("utf-8")
    return [json.loads(line) for line in text.split("\n") if line.strip(" \t\r\n")]


def write_parquet(path: Path, n: int, start: int, row_group_size: int):
    ids = list(range(start, start + n))
    table = pa.table({"text": [f"doc {i}" for i in ids], "id": ids, "score": [i / 7 for i in ids]})
    pq.write_table(table, path, row_group_size=max(1, row_group_size))


def mem_root() -> str:
    """A fresh ``memory://`` directory URL (the memory filesystem is process-global)."""
    return f"memory:///zephon-test-{uuid.uuid4().hex}"


def mem_path(url: str) -> str:
    return url[len("memory://") :]


def assert_typed(exc_info, zephon_cls, builtin_cls, *substrings):
    exc = exc_info.value
    assert isinstance(exc, zephon_cls) and isinstance(exc, ZephonError)
    assert isinstance(exc, builtin_cls)
    for s in substrings:
        assert s in str(exc), (s, str(exc))


@pytest.fixture(autouse=True)
def _fresh_caches():
    jsonl_mod.SPANS.clear()
    tokens_mod.OPENED.clear()
    yield


# ---------------------------------------------------------------- JSONL reads
NOISE = st.lists(st.sampled_from(["", "  ", "\t", " \r", "\r"]), max_size=3)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@FAST
@given(
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=4),
    noise=NOISE,
    crlf=st.booleans(),
    text=TEXT,
    data=st.data(),
)
def test_jsonl_read_matches_oracle(sizes, noise, crlf, text, data):
    if sum(sizes) == 0:
        sizes[0] = 1
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for k, n in enumerate(sizes):
            recs = [{"text": f"{text}{k}-{i}", "i": i} for i in range(n)]
            write_jsonl(
                root / f"part-{k:02d}.jsonl", recs, noise=noise, end="\r\n" if crlf else "\n"
            )
        ds = Dataset.from_jsonl("j", root, progress=False)
        assert ds.shard_sizes == tuple(sizes) and len(ds) == sum(sizes)
        for s, shard in enumerate(ds.shards):
            if shard.num_samples == 0:
                assert ds.read(s, []) == []
                continue
            offsets = data.draw(st.lists(st.integers(0, shard.num_samples - 1), max_size=30))
            expected = oracle_jsonl(root / shard.shard_id)
            assert ds.read(s, offsets) == [expected[o] for o in offsets]
            jsonl_mod.SPANS.clear()  # a fresh process rescans and must agree
            assert ds.read(s, np.array(offsets, dtype=np.int64)) == [expected[o] for o in offsets]


@FAST
@given(
    lines=st.lists(
        st.sampled_from(['{"text":"a"}', "", "  ", ' {"text":"b"}', "\t\r"]), max_size=20
    ),
    trailing=st.booleans(),
    block=st.integers(1, 40),
)
def test_jsonl_scan_block_boundaries(lines, trailing, block):
    raw = ("\n".join(lines) + ("\n" if trailing else "")).encode()
    fs = fsspec.filesystem("memory")
    name = f"/scan-{uuid.uuid4().hex}.jsonl"
    fs.pipe_file(name, raw)
    spans, size = jsonl_mod.scan(fs, name, block=block)
    assert size == len(raw)
    expected = [ln for ln in raw.split(b"\n") if ln.strip(b" \t\r\n")]
    assert [raw[s:e] for s, e in spans.tolist()] == expected
    fs.rm_file(name)


def test_jsonl_coalesced_and_distant_ranges(tmp_path, monkeypatch):
    recs = [{"text": "x" * 50, "i": i} for i in range(400)]
    write_jsonl(tmp_path / "a.jsonl", recs)
    monkeypatch.setattr(jsonl_mod, "GAP", 100)  # force many separate ranges
    ds = Dataset.from_jsonl("a", tmp_path / "a.jsonl", progress=False)
    offsets = [399, 0, 1, 2, 200, 399, 5, 300]
    assert ds.read(0, offsets) == [recs[o] for o in offsets]


def test_jsonl_records_are_fresh_objects(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a", "tags": [1]}])
    ds = Dataset.from_jsonl("a", tmp_path, progress=False)
    first, second = ds.read(0, [0, 0])
    first["tags"].append(2)
    assert second == {"text": "a", "tags": [1]}


# -------------------------------------------------------------- parquet reads
@FAST
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    rg=st.integers(1, 9),
    columns=st.sampled_from([None, ["id"], ["score", "id"]]),
    data=st.data(),
)
def test_parquet_read_matches_oracle(sizes, rg, columns, data):
    if sum(sizes) == 0:
        sizes[-1] = 3
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        start = 0
        for k, n in enumerate(sizes):
            write_parquet(root / f"f{k}.parquet", n, start, rg)
            start += n
        ds = Dataset.from_parquet("p", root, columns=columns, progress=False)
        assert ds.shard_sizes == tuple(sizes)
        keep = None if columns is None else ["text", *columns]
        for s, shard in enumerate(ds.shards):
            if shard.num_samples == 0:
                continue
            offsets = data.draw(st.lists(st.integers(0, shard.num_samples - 1), max_size=30))
            table = pq.read_table(root / shard.shard_id, columns=keep).to_pylist()
            assert ds.read(s, offsets) == [table[o] for o in offsets]


def test_parquet_reads_only_needed_row_groups(tmp_path, monkeypatch):
    write_parquet(tmp_path / "a.parquet", 100, 0, 10)
    ds = Dataset.from_parquet("p", tmp_path, columns=["id"], progress=False)
    seen = []
    original = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, columns=None, **kw):
        seen.append((list(row_groups), columns))
        return original(self, row_groups, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    assert [r["id"] for r in ds.read(0, [95, 3, 97])] == [95, 3, 97]
    assert seen == [([0, 9], ["text", "id"])]


# ---------------------------------------------------------------- token store
@FAST
@given(
    shards=st.dictionaries(
        st.sampled_from(["a", "b-1", "c.2", "z"]),
        st.lists(st.lists(st.integers(0, 70000), max_size=8), max_size=12),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
)
def test_tokens_read_matches_oracle(shards, data):
    if not any(shards.values()):
        shards[next(iter(shards))] = [[1, 2]]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        write_token_store(
            path,
            {k: [np.array(x, dtype=np.int64) for x in v] for k, v in shards.items()},
            {"sha256": "abc"},
        )
        ds = Dataset.from_tokens("t", path)
        assert [s.shard_id for s in ds.shards] == sorted(shards)
        assert ds.tokenizer_meta == {"sha256": "abc"} and ds.text_field == "tokens"
        top = max((max(x) for v in shards.values() for x in v if x), default=0)
        for s, shard in enumerate(ds.shards):
            docs = shards[shard.shard_id]
            assert shard.num_samples == len(docs)
            if not docs:
                continue
            offsets = data.draw(st.lists(st.integers(0, len(docs) - 1), max_size=20))
            got = ds.read(s, offsets)
            for rec, o in zip(got, offsets, strict=True):
                assert rec["tokens"].dtype == (np.uint16 if top < 65536 else np.uint32)
                assert rec["tokens"].tolist() == docs[o]


def test_tokens_layout_and_memory_url():
    root = mem_root()
    write_token_store(f"{root}/tok", {"s0": [np.arange(5), np.arange(2)]})
    zj = json.loads(fsspec.filesystem("memory").cat_file(f"{mem_path(root)}/tok/zarr.json"))
    attrs = zj["attributes"]
    assert attrs["format"] == "zephon_dask.tokens" and attrs["version"] == 1
    assert attrs["shards"] == ["s0"]
    ds = Dataset.from_path("t", f"{root}/tok")
    assert ds.format == "tokens" and ds.shard_sizes == (2,)
    assert ds.read(0, [1])[0]["tokens"].tolist() == [0, 1]


def test_tokens_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_tokens("t", tmp_path / "missing")
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, "missing")
    import zarr

    zarr.open_group(str(tmp_path / "other"), mode="w").attrs["format"] = "something"
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_tokens("t", tmp_path / "other")
    assert_typed(ei, DataFormatError, ValueError, "other", "not a zephon_dask token store")
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_path("t", tmp_path / "other")
    assert_typed(ei, DataFormatError, ValueError, "something")
    with pytest.raises(ConfigError) as ei:
        write_token_store(str(tmp_path / "x"), {"a/b": [np.arange(2)]})
    assert_typed(ei, ConfigError, ValueError, "a/b")
    with pytest.raises(ConfigError) as ei:
        write_token_store(str(tmp_path / "x"), {"a": [np.array([-1])]})
    assert_typed(ei, ConfigError, ValueError, "'a' document 0")
    write_token_store(str(tmp_path / "empty"), {"a": []})
    with pytest.raises(EmptyDatasetError) as ei:
        Dataset.from_tokens("e", tmp_path / "empty")
    assert_typed(ei, EmptyDatasetError, ValueError, "'e'")


# -------------------------------------------------------------------- records
def test_records_list_mapping_and_strings():
    ds = Dataset.from_records("r", ["a", {"text": "b", "k": (1, 2)}])
    assert ds.shard_sizes == (2,) and ds.shards[0] == Shard("0", None, 2)
    assert ds.read(0, [1, 0, 1]) == [
        {"text": "b", "k": [1, 2]},
        {"text": "a"},
        {"text": "b", "k": [1, 2]},
    ]
    m = Dataset.from_records("m", {10: ["x"], 2: ["y", "z"], "b": []}, text_field="body")
    assert [s.shard_id for s in m.shards] == ["10", "2", "b"]
    assert m.shard_sizes == (1, 2, 0)
    assert m.read(1, [1]) == [{"body": "z"}]


def test_records_identity_tracks_content_not_order_of_keys():
    a = Dataset.from_records("r", [{"text": "a", "x": 1}])
    b = Dataset.from_records("r", [{"x": 1, "text": "a"}])
    c = Dataset.from_records("r", [{"text": "a", "x": 2}])
    assert a.identity() == b.identity() != c.identity()
    json.dumps(a.identity())


def test_records_errors():
    with pytest.raises(MissingFieldError) as ei:
        Dataset.from_records("r", {"s": ["ok", {"body": "x", "id": 1}]})
    assert_typed(
        ei,
        MissingFieldError,
        ValueError,
        "'r'",
        "shard 's'",
        "record 1",
        "'body'",
        "'id'",
        "text_field",
    )
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_records("r", ["ok", 5])
    assert_typed(ei, DataFormatError, ValueError, "record 1", "int")
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_records("r", [{"text": object()}])
    assert_typed(ei, DataFormatError, ValueError, "not JSON-serialisable")
    with pytest.raises(ConfigError) as ei:
        Dataset.from_records("r", "just a string")
    assert_typed(ei, ConfigError, ValueError, "str")
    with pytest.raises(ConfigError) as ei:
        Dataset.from_records("r", {1: ["a"], "1": ["b"]})
    assert_typed(ei, ConfigError, ValueError, "collide")
    with pytest.raises(EmptyDatasetError) as ei:
        Dataset.from_records("r", {"a": [], "b": []})
    assert_typed(ei, EmptyDatasetError, ValueError, "'r'", "'a'", "'b'")


# -------------------------------------------------------------- index cache
def _count_inspects(monkeypatch, module):
    calls = []
    original = module.inspect

    def counting(fs, f):
        calls.append(f.rel)
        return original(fs, f)

    reader = dataclasses.replace(module.READER, inspect=counting)
    monkeypatch.setitem(formats_mod.READERS, reader.name, reader)
    return calls


def _cached(directory) -> dict:
    """The index cache document of a local data directory."""
    target = index_mod.index_file(os.path.abspath(directory), index_mod.cache_dir())
    with open(target) as fh:
        return json.load(fh)


def test_index_cache_reuse_and_invalidation(tmp_path, monkeypatch):
    for k in range(5):
        write_jsonl(tmp_path / f"p{k}.jsonl", [{"text": str(i)} for i in range(k + 1)])
    calls = _count_inspects(monkeypatch, jsonl_mod)
    ds1 = Dataset.from_jsonl("a", tmp_path, progress=False)
    assert sorted(calls) == [f"p{k}.jsonl" for k in range(5)]
    assert not (tmp_path / "index.json").exists()
    doc = _cached(tmp_path)
    assert doc["version"] == index_mod.INDEX_VERSION and doc["url"] == str(tmp_path)
    assert doc["files"]["p2.jsonl"]["num_samples"] == 3
    assert set(doc["files"]["p2.jsonl"]) >= {"size", "mtime", "num_samples", "format"}

    calls.clear()
    ds2 = Dataset.from_jsonl("a", tmp_path, progress=False)
    assert calls == [] and ds2.shards == ds1.shards

    # content change (size) -> only that file rebuilt
    write_jsonl(tmp_path / "p1.jsonl", [{"text": "new"}] * 7)
    ds3 = Dataset.from_jsonl("a", tmp_path, progress=False)
    assert calls == ["p1.jsonl"] and ds3.shard_sizes == (1, 7, 3, 4, 5)

    # touch (mtime only) -> only that file rebuilt
    calls.clear()
    st_ = os.stat(tmp_path / "p3.jsonl")
    os.utime(tmp_path / "p3.jsonl", (st_.st_atime, st_.st_mtime + 10))
    Dataset.from_jsonl("a", tmp_path, progress=False)
    assert calls == ["p3.jsonl"]


def test_build_index_counter_and_shared_index(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 3)
    write_parquet(tmp_path / "b.parquet", 4, 0, 2)
    listing = list_files(str(tmp_path / "a.jsonl"))
    fs, files = listing.fs, listing.files
    first = index_mod.build_index(fs, files, "jsonl", jsonl_mod.inspect, progress=False)
    assert first.rebuilt == 1 and first.entries[0]["num_samples"] == 3
    again = index_mod.build_index(fs, files, "jsonl", jsonl_mod.inspect, progress=False)
    assert again.rebuilt == 0 and again.entries == first.entries
    Dataset.from_parquet("b", tmp_path / "b.parquet", progress=False)  # merges into the same index
    doc = _cached(tmp_path)
    assert set(doc["files"]) == {"a.jsonl", "b.parquet"}
    assert doc["files"]["b.parquet"]["columns"] == ["text", "id", "score"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.parquet"]


def test_corrupt_index_is_rebuilt(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 2)
    target = index_mod.index_file(str(tmp_path), index_mod.cache_dir())
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as fh:
        fh.write("{not json")
    assert Dataset.from_jsonl("a", tmp_path, progress=False).num_samples == 2
    assert _cached(tmp_path)["files"]["a.jsonl"]["num_samples"] == 2


def test_unwritable_index_warns_once_and_continues(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 2)
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    with pytest.warns(UserWarning, match="index cache"):
        ds = Dataset.from_jsonl("a", tmp_path / "a.jsonl", progress=False, cache_dir=blocked)
    assert ds.read(0, [1]) == [{"text": "x"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Dataset.from_jsonl("a", tmp_path / "a.jsonl", progress=False, cache_dir=blocked)


def test_file_changed_since_indexed(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": str(i)} for i in range(4)])
    ds = Dataset.from_jsonl("a", tmp_path, progress=False)
    write_jsonl(tmp_path / "a.jsonl", [{"text": str(i)} for i in range(9)])
    jsonl_mod.SPANS.clear()
    with pytest.raises(DataFormatError) as ei:
        ds.read(0, [0])
    assert_typed(
        ei, DataFormatError, ValueError, "a.jsonl", "changed since it was indexed", "rebuild"
    )


# ------------------------------------------------------- paths and fsspec URLs
def test_directory_glob_and_nested(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b"}])
    write_jsonl(tmp_path / "a.json", [{"text": "a"}] * 2)
    write_jsonl(tmp_path / "sub" / "c.jsonl", [{"text": "c"}] * 3)
    write_jsonl(tmp_path / ".hidden" / "d.jsonl", [{"text": "d"}])
    (tmp_path / "README.md").write_text("hi")
    (tmp_path / "_SUCCESS").write_text("")
    with pytest.warns(ZephonWarning, match="README.md") as seen:
        ds = Dataset.from_jsonl("d", tmp_path, progress=False)
    assert len(seen) == 1 and "_SUCCESS" not in str(seen[0].message)
    assert [s.shard_id for s in ds.shards] == ["a.json", "b.jsonl", "sub/c.jsonl"]
    assert ds.read(2, [2]) == [{"text": "c"}]
    assert not (tmp_path / "sub" / "index.json").exists()
    g = Dataset.from_jsonl("g", str(tmp_path / "*.jsonl"), progress=False)
    assert [s.shard_id for s in g.shards] == ["b.jsonl"]
    f = Dataset.from_path("f", tmp_path / "sub" / "c.jsonl", progress=False)
    assert f.format == "jsonl" and f.shards[0].shard_id == "c.jsonl"


def test_memory_url_and_identity_independent_of_location(tmp_path):
    root = mem_root()
    fs = fsspec.filesystem("memory")
    local = [{"text": f"t{i}"} for i in range(6)]
    write_jsonl(tmp_path / "x.jsonl", local)
    fs.pipe_file(f"{mem_path(root)}/x.jsonl", (tmp_path / "x.jsonl").read_bytes())
    m = Dataset.from_path("x", root, progress=False)
    assert m.shards[0].path == f"{root}/x.jsonl"
    assert m.read(0, [5, 1]) == [local[5], local[1]]
    assert fs.ls(mem_path(root), detail=False) == [f"{mem_path(root)}/x.jsonl"]
    on_disk = Dataset.from_jsonl("x", tmp_path, progress=False)
    assert m.identity() == on_disk.identity()
    assert json.loads(json.dumps(m.identity())) == m.identity()
    assert "mtime" not in json.dumps(m.identity()) and str(tmp_path) not in json.dumps(
        on_disk.identity()
    )


def test_pickle_round_trip_reads(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}, {"text": "b"}])
    write_parquet(tmp_path / "p.parquet", 5, 0, 2)
    write_token_store(str(tmp_path / "tok"), {"s": [np.arange(3), np.arange(2)]}, {"sha256": "h"})
    for ds in (
        Dataset.from_jsonl("j", tmp_path / "a.jsonl", progress=False),
        Dataset.from_parquet("p", tmp_path / "p.parquet", progress=False),
        Dataset.from_tokens("t", tmp_path / "tok"),
        Dataset.from_records("r", {"a": ["x", "y"]}),
    ):
        back = pickle.loads(pickle.dumps(ds))
        jsonl_mod.SPANS.clear()
        tokens_mod.OPENED.clear()
        assert back.identity() == ds.identity() and back.shards == ds.shards
        assert repr(back) == repr(ds)
        a, b = back.read(0, [1, 0]), ds.read(0, [1, 0])
        assert json.dumps(a, default=lambda v: v.tolist()) == json.dumps(
            b, default=lambda v: v.tolist()
        )


def test_dataset_is_immutable():
    ds = Dataset.from_records("r", ["a"])
    with pytest.raises(AttributeError):
        ds.name = "other"


# ------------------------------------------------------------------- errors
def test_missing_paths(tmp_path):
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_jsonl("a", tmp_path / "nope.jsonl")
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, "nope.jsonl", "does not exist")
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_jsonl("a", str(tmp_path / "*.jsonl"))
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, "'a'", "glob", "*.jsonl")
    (tmp_path / "notes.log").write_text("x")
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_parquet("p", tmp_path)
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, ".parquet", ".log", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_path("p", f"{mem_root()}/absent")
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, "absent")


def test_empty_dataset_and_empty_shards(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n  \n")
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(EmptyDatasetError) as ei:
        Dataset.from_jsonl("e", tmp_path, progress=False)
    assert_typed(ei, EmptyDatasetError, ValueError, "'e'", "a.jsonl", "b.jsonl")
    write_jsonl(tmp_path / "c.jsonl", [{"text": "c"}])
    ds = Dataset.from_jsonl("e", tmp_path, progress=False)
    assert ds.shard_sizes == (0, 0, 1) and ds.num_shards == 3


def test_jsonl_bad_lines(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"text": "ok"}\n\n{"text": broken}\n[1, 2]\n{"body": "x", "id": 3}\n'
    )
    ds = Dataset.from_jsonl("bad", tmp_path, progress=False)
    assert ds.read(0, [0]) == [{"text": "ok"}]
    with pytest.raises(DataFormatError) as ei:
        ds.read(0, [1])
    assert_typed(ei, DataFormatError, ValueError, "a.jsonl", "line 3", "not valid JSON")
    with pytest.raises(DataFormatError) as ei:
        ds.read(0, [2])
    assert_typed(ei, DataFormatError, ValueError, "a.jsonl", "line 4", "list")
    with pytest.raises(MissingFieldError) as ei:
        ds.read(0, [3])
    assert_typed(
        ei,
        MissingFieldError,
        ValueError,
        "'bad'",
        "a.jsonl",
        "line 5",
        "offset 3",
        "'body'",
        "'id'",
        "text_field=",
    )


def test_parquet_errors(tmp_path):
    write_parquet(tmp_path / "a.parquet", 5, 0, 2)
    with pytest.raises(MissingFieldError) as ei:
        Dataset.from_parquet("p", tmp_path, text_field="body", progress=False)
    assert_typed(ei, MissingFieldError, ValueError, "a.parquet", "'body'", "'id'", "'score'")
    with pytest.raises(MissingFieldError) as ei:
        Dataset.from_parquet("p", tmp_path, columns=["nope"], progress=False)
    assert_typed(ei, MissingFieldError, ValueError, "'nope'")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_parquet("p", tmp_path, progress=False)
    assert_typed(ei, DataFormatError, ValueError, "bad.parquet")


def test_from_path_detection_errors(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    write_parquet(tmp_path / "b.parquet", 2, 0, 1)
    with pytest.raises(ConfigError) as ei:
        Dataset.from_path("m", tmp_path)
    assert_typed(ei, ConfigError, ValueError, ".jsonl", ".parquet", "from_jsonl")
    (tmp_path / "c.csv").write_text("x")
    with pytest.raises(ConfigError) as ei:
        Dataset.from_path("m", tmp_path / "c.csv")
    assert_typed(ei, ConfigError, ValueError, ".csv")
    assert Dataset.from_path("p", str(tmp_path / "*.parquet"), progress=False).format == "parquet"


def test_name_and_argument_validation(tmp_path):
    for bad in ("", None, 3):
        with pytest.raises(ConfigError) as ei:
            Dataset.from_records(bad, ["a"])
        assert_typed(ei, ConfigError, ValueError, repr(bad))
    ds = Dataset.from_records("r", {"a": ["x", "y"]})
    for shard, offsets, fragment in ((1, [0], "shard index 1"), (0, [0, 2], "offset 2"), (0, [-1], "offset -1")):
        with pytest.raises(RecordIndexError) as ei:
            ds.read(shard, offsets)
        assert_typed(ei, RecordIndexError, IndexError, fragment)
    with pytest.raises(ArgumentTypeError) as ei:
        ds.read(0, [0.5])
    assert_typed(ei, ArgumentTypeError, TypeError, "offsets must be a 1-D sequence of ints")


def test_check_unique_names():
    a, b = Dataset.from_records("a", ["x"]), Dataset.from_records("b", ["y"])
    check_unique_names([a, b])
    with pytest.raises(DuplicateNameError) as ei:
        check_unique_names([a, b, Dataset.from_records("a", ["z"])])
    assert_typed(ei, DuplicateNameError, ValueError, "'a'")


def test_no_heavy_imports():
    import subprocess
    import sys

    code = "import sys, zephon_dask.data; print(any(m in sys.modules for m in ('dask', 'distributed', 'torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
