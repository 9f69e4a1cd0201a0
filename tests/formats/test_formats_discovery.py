"""Bringing your own data: nothing written beside it, symlinks, data_files, the format registry."""

from __future__ import annotations

import json
import os
import stat
import warnings
from html import escape as html_escape
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from tests.formats.test_data import assert_typed, mem_path, mem_root, write_jsonl, write_parquet
from zephon_dask.data import Dataset
from zephon_dask.data import formats as formats_mod
from zephon_dask.data import index as index_mod
from zephon_dask.data.paths import glob_regex
from zephon_dask.data.reader import Reader
from zephon_dask.errors import ConfigError, DatasetNotFoundError, ZephonWarning
from zephon_dask.recipe import dataset_formats, load_recipe


def tree(root: Path) -> dict[str, tuple[int, float]]:
    """Every entry under ``root`` (links not followed) with its size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime)
    return out


def all_rows(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, np.arange(n))]


# ------------------------------------------------------------ never write beside the data
def test_read_only_folder_is_left_untouched(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"text": str(i)} for i in range(5)])
    write_parquet(data / "b.parquet", 7, 0, 3)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEPHON_DASK_CACHE_DIR", str(cache))
    before = tree(data)
    os.chmod(data, stat.S_IRUSR | stat.S_IXUSR)
    try:
        j = Dataset.from_jsonl("j", data, data_files="*.jsonl", progress=False)
        p = Dataset.from_parquet("p", data, data_files="*.parquet", progress=False)
        Dataset.from_jsonl("j", data, data_files="*.jsonl", progress=False)  # from the cache
    finally:
        os.chmod(data, stat.S_IRWXU)
    assert tree(data) == before  # nothing created, nothing touched (root ignores chmod)
    assert j.num_samples == 5 and p.num_samples == 7
    doc = json.loads(Path(index_mod.index_file(str(data), str(cache))).read_text())
    assert doc["url"] == str(data) and set(doc["files"]) == {"a.jsonl", "b.parquet"}
    # another tool still reads the folder as before
    assert pads.dataset(str(data / "b.parquet"), format="parquet").count_rows() == 7


def test_parquet_folder_stays_readable_by_pyarrow(tmp_path):
    for k in range(2):
        write_parquet(tmp_path / f"p{k}.parquet", 4, 4 * k, 2)
    Dataset.from_parquet("p", tmp_path, progress=False)
    assert pads.dataset(str(tmp_path), format="parquet").count_rows() == 8


def test_memory_store_gets_no_files(tmp_path):
    root = mem_root()
    fs = fsspec.filesystem("memory")
    write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}, {"text": "b"}])
    fs.pipe_file(f"{mem_path(root)}/x.jsonl", (tmp_path / "x.jsonl").read_bytes())
    Dataset.from_path("x", root, progress=False)
    assert fs.find(mem_path(root)) == [f"{mem_path(root)}/x.jsonl"]


@pytest.mark.parametrize(
    "foreign",
    [
        '{"version": 2, "shards": [{"format": "mds"}]}',  # Mosaic MDS
        '{"chunks": [], "config": {"compression": null}}',  # litdata
        '{"version": 1, "files": {"a.jsonl": {"format": "jsonl", "num_samples": 99}}}',  # ours, old
        "not json at all",
    ],
)
def test_foreign_index_json_is_neither_data_nor_trusted(tmp_path, foreign):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 3)
    (tmp_path / "index.json").write_text(foreign)
    ds = Dataset.from_jsonl("a", tmp_path, progress=False)
    assert ds.shard_sizes == (3,) and [s.shard_id for s in ds.shards] == ["a.jsonl"]
    assert (tmp_path / "index.json").read_text() == foreign


def test_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_DASK_CACHE_DIR", str(tmp_path / "env"))
    assert index_mod.cache_dir() == str(tmp_path / "env")
    assert index_mod.cache_dir(tmp_path / "arg") == str(tmp_path / "arg")
    monkeypatch.delenv("ZEPHON_DASK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert index_mod.cache_dir() == str(tmp_path / "xdg" / "zephon_dask")
    a = index_mod.index_file("/data/a", "/c")
    assert a != index_mod.index_file("s3://bucket/data/a", "/c") and a.startswith("/c/index/")


def test_cache_dir_argument_and_signature(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 2)
    cache = tmp_path / "mine"
    Dataset.from_jsonl("a", tmp_path / "a.jsonl", progress=False, cache_dir=cache)
    (entry,) = json.loads(next(cache.rglob("*.json")).read_text())["files"].values()
    assert entry["size"] == (tmp_path / "a.jsonl").stat().st_size and "mtime" in entry
    assert "etag" in entry


# --------------------------------------------------------------------------- symlinks
def test_symlinked_files_and_folders_are_followed(tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    (elsewhere / "deep").mkdir(parents=True)
    write_parquet(data / "a.parquet", 400, 0, 100)
    write_parquet(data / "b.parquet", 400, 400, 100)
    write_parquet(elsewhere / "c.parquet", 400, 800, 100)
    write_parquet(elsewhere / "deep" / "d.parquet", 5, 0, 5)
    os.symlink(elsewhere / "c.parquet", data / "c.parquet")
    os.symlink(elsewhere / "deep", data / "more")
    os.symlink(data, data / "more" / "loop")  # a cycle must not hang
    os.symlink(tmp_path / "gone.parquet", data / "dangling.parquet")
    ds = Dataset.from_parquet("p", data, progress=False)
    assert [s.shard_id for s in ds.shards] == ["a.parquet", "b.parquet", "c.parquet", "more/d.parquet"]
    assert ds.shard_sizes == (400, 400, 400, 5)
    assert ds.read(2, [0])[0]["id"] == 800 and ds.shards[2].path == str(data / "c.parquet")
    files = [str(data / n) for n in ("a.parquet", "b.parquet", "c.parquet")]
    assert pads.dataset(files, format="parquet").count_rows() == 1200


def test_all_symlink_folder(tmp_path):
    blobs, snap = tmp_path / "blobs", tmp_path / "snap"
    blobs.mkdir()
    snap.mkdir()
    for k in range(2):
        write_jsonl(blobs / f"{k:040x}", [{"text": f"{k}-{i}"} for i in range(3)])
        os.symlink(blobs / f"{k:040x}", snap / f"part{k}.jsonl")
    ds = Dataset.from_path("s", snap, progress=False)
    assert ds.shard_sizes == (3, 3) and ds.read(1, [2]) == [{"text": "1-2"}]


# --------------------------------------------------------------------- data_files, mixes
def hf_repo(root: Path) -> None:
    (root / "data").mkdir(parents=True)
    for split, n in (("train", 2), ("test", 1)):
        for k in range(n):
            write_parquet(root / "data" / f"{split}-{k:05d}-of-{n:05d}.parquet", 6, 100 * k, 3)
    (root / "README.md").write_text("# card")


def test_data_files_pick_a_split(tmp_path):
    hf_repo(tmp_path)
    with pytest.warns(ZephonWarning, match="README.md"):
        mixed = Dataset.from_parquet("all", tmp_path, progress=False)
    assert mixed.num_shards == 3  # a plain folder read takes every split: data_files chooses
    train = Dataset.from_parquet("t", tmp_path, data_files="data/train-*", progress=False)
    assert [s.shard_id for s in train.shards] == [
        "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"
    ]
    assert "data/train-00000-of-00002.parquet" in repr(train) and "data_files" in repr(train)
    assert "data/train-*" in train._repr_html_()
    assert mixed.skipped == ("README.md",) and mixed.num_skipped == 1 and train.num_skipped == 0
    test = Dataset.from_path("t", tmp_path, data_files=["data/test-*"], progress=False)
    assert test.format == "parquet" and test.num_shards == 1
    with pytest.raises(DatasetNotFoundError) as ei:
        Dataset.from_parquet("v", tmp_path, data_files="data/validation-*", progress=False)
    assert_typed(ei, DatasetNotFoundError, FileNotFoundError, "validation", "data/test-")
    with pytest.raises(ConfigError) as ei:
        Dataset.from_parquet("v", tmp_path, data_files=3, progress=False)
    assert_typed(ei, ConfigError, ValueError, "data_files", "3")


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("data/train-*", ["data/train-0.parquet"], ["data/x/train-0.parquet", "train-0.parquet"]),
        ("**/*.parquet", ["a.parquet", "x/y/a.parquet"], ["a.jsonl"]),
        ("**/train[-._ 0-9]*", ["train-1.pq", "d/train_a.pq"], ["trainer.pq", "d/mytrain.pq"]),
        ("part-?.jsonl", ["part-1.jsonl"], ["part-12.jsonl"]),
        ("[!a]*.jsonl", ["b.jsonl"], ["a.jsonl"]),
        ("[^a]*.jsonl", ["a.jsonl", "^.jsonl"], ["b.jsonl"]),  # as in fsspec and shells: ^ is no negation
        ("/data/*.jsonl", ["data/a.jsonl"], ["/data/a.jsonl"]),
        ("a/**", ["a/b", "a/b/c.jsonl"], ["b/a/c"]),
        ("a[b", ["a[b"], ["ab"]),
    ],
)
def test_glob_semantics(pattern, yes, no):
    r = glob_regex(pattern)
    assert all(r.fullmatch(p) for p in yes) and not any(r.fullmatch(p) for p in no)


def test_a_glob_with_double_star_inside_a_name_is_refused():
    with pytest.raises(ConfigError) as ei:
        glob_regex("data/**.jsonl")
    assert_typed(ei, ConfigError, ValueError, "data/**.jsonl", "**/*.jsonl")


def test_mixed_formats_refused_and_others_warned_once(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    write_parquet(tmp_path / "b.parquet", 2, 0, 1)
    with pytest.raises(ConfigError) as ei:
        Dataset.from_path("m", tmp_path)
    assert_typed(ei, ConfigError, ValueError, ".jsonl", ".parquet", "data_files")
    (tmp_path / "notes.log").write_text("x")
    with pytest.warns(ZephonWarning) as seen:
        ds = Dataset.from_jsonl("j", tmp_path, progress=False)
    assert len(seen) == 1 and "b.parquet" in str(seen[0].message)
    assert "notes.log" in str(seen[0].message) and ds.num_shards == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Dataset.from_jsonl("j", str(tmp_path / "*.jsonl"), progress=False)


def test_repr_and_html_show_the_chosen_files(tmp_path):
    (tmp_path / "web").mkdir()
    for i in range(6):
        write_jsonl(tmp_path / "web" / f"part-{i}.jsonl", [{"text": str(i)}])
    for i in range(25):
        (tmp_path / "web" / f"note-{i:02d}.log").write_text("x")
    with pytest.warns(ZephonWarning, match="ignoring 25 file"):
        ds = Dataset.from_jsonl("web", tmp_path / "web", progress=False)
    assert ds.num_skipped == 25 and len(ds.skipped) == 20 and ds.skipped[0] == "note-00.log"
    chosen = (f"6 files from {str(tmp_path / 'web')!r}: part-0.jsonl, part-1.jsonl, "
              "part-2.jsonl and 3 more; skipped 25: note-00.log, note-01.log, note-02.log and 22 more")
    assert ds.chosen_files() == chosen
    text = repr(ds)
    assert "files=6 ['part-0.jsonl', 'part-1.jsonl', 'part-2.jsonl' and 3 more]" in text
    assert "skipped=25 ['note-00.log', 'note-01.log', 'note-02.log' and 22 more]" in text
    assert "part-3.jsonl" not in text and "note-03.log" not in text and "\n" not in text
    html = ds._repr_html_()
    assert html_escape(chosen) in html and "note-03.log" not in html
    some = Dataset.from_jsonl("web", tmp_path / "web", data_files=["part-[12].jsonl"], progress=False)
    assert some.chosen_files() == (f"2 files from {str(tmp_path / 'web')!r} with data_files "
                                   "['part-[12].jsonl']: part-1.jsonl, part-2.jsonl")
    assert "skipped" not in repr(some) and "skipped" not in some._repr_html_()
    one = Dataset.from_jsonl("one", tmp_path / "web" / "part-0.jsonl", progress=False)
    assert one.chosen_files().startswith("1 file from ") and one.chosen_files().endswith(": part-0.jsonl")
    assert Dataset.from_records("r", ["a"]).chosen_files() == ""


# ---------------------------------------------------------------------------- registry
def test_registry_drives_constructors_recipes_and_reads(tmp_path):
    for name, reader in formats_mod.READERS.items():
        assert reader.name == name and reader.doc  # a constructor is optional
        assert reader.constructor is None or callable(getattr(Dataset, reader.constructor))
    assert set(dataset_formats()) == set(formats_mod.NAMES) - {"records"}
    assert formats_mod.of_file("x/chat.jsonl.gz").name == "jsonl"
    assert formats_mod.of_file("shard.00000.mds.zstd").name == "mds"
    assert formats_mod.of_file("notes.log") is None
    holds = {n for n, r in formats_mod.READERS.items() if r.holds_tokens}
    assert holds == {"tokens"}
    table = pa.table({"text": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "t.parquet")
    ds = Dataset.from_path("t", tmp_path / "t.parquet", progress=False)
    assert ds.reader is formats_mod.READERS["parquet"] and not ds.holds_tokens
    assert ds.read(0, [2, 0]) == [{"text": "c"}, {"text": "a"}]
    with pytest.raises(ConfigError) as ei:
        Dataset("x", "csv", "text", ())
    assert_typed(ei, ConfigError, ValueError, "csv", "jsonl")


def _lines_inspect(fs, f):
    return {"num_samples": len(fs.cat_file(f.name).decode().splitlines())}


def _lines_read(dataset, index, offsets):
    shard = dataset.shards[index]
    lines = Path(shard.path).read_text().splitlines()
    return [{dataset.text_field: lines[i]} for i in offsets.tolist()]


def test_a_new_format_is_one_reader_and_one_registry_line(tmp_path, monkeypatch):
    lines = Reader("lines", None, _lines_read, inspect=_lines_inspect, extensions=(".txt",),
                   html=lambda ds: [("kind", "plain text")])
    monkeypatch.setitem(formats_mod.READERS, "lines", lines)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "data" / "b.txt").write_text("four\n")
    ds = Dataset.from_path("l", tmp_path / "data", progress=False)
    assert ds.format == "lines" and ds.shard_sizes == (3, 1)
    assert ds.read(0, [2, 0]) == [{"text": "three"}, {"text": "one"}]
    assert "plain text" in ds._repr_html_() and ds.identity()["format"] == "lines"
    (tmp_path / "r.toml").write_text(
        '[[datasets]]\nname = "l"\npath = "data"\nformat = "lines"\n[batch]\nmicrobatch_size = 1\n'
    )
    (entry,) = load_recipe(tmp_path / "r.toml").datasets
    assert entry.open().shard_sizes == (3, 1)
