"""Hugging Face datasets on disk, read in place and compared with ``datasets``' own loaders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.formats.test_data import assert_typed
from zephon_dask.data import Dataset
from zephon_dask.data.hf import split_patterns
from zephon_dask.data.paths import list_files
from zephon_dask.errors import ConfigError, DataFormatError

datasets = pytest.importorskip("datasets")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def rows(n: int, start: int = 0) -> dict[str, list]:
    return {"text": [f"doc {i} " + "x" * (i % 13) for i in range(start, start + n)],
            "id": list(range(start, start + n)),
            "meta": [{"k": i % 3, "tags": ["a"] * (i % 2)} for i in range(start, start + n)]}


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, np.arange(n))]


def test_save_to_disk_dataset_and_dict(tmp_path):
    one = datasets.Dataset.from_dict(rows(120))
    one.save_to_disk(str(tmp_path / "one"), num_shards=3)
    ours = Dataset.from_hf("one", tmp_path / "one", progress=False)
    theirs = datasets.load_from_disk(str(tmp_path / "one"))
    assert ours.format == "arrow" and ours.num_shards == 3 and len(ours) == len(theirs)
    assert everything(ours) == [theirs[i] for i in range(len(theirs))]
    assert Dataset.from_path("p", tmp_path / "one", progress=False).identity() == Dataset.from_hf(
        "p", tmp_path / "one", progress=False).identity()
    picked = Dataset.from_hf("one", tmp_path / "one", columns=["id"], progress=False)
    assert picked.read(1, [0]) == [{"text": theirs[40]["text"], "id": 40}]

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows(50)),
                               "test": datasets.Dataset.from_dict(rows(7, 1000))})
    dd.save_to_disk(str(tmp_path / "dd"))
    back = datasets.load_from_disk(str(tmp_path / "dd"))
    for split in ("train", "test"):
        ours = Dataset.from_hf(split, tmp_path / "dd", split=split, progress=False)
        assert everything(ours) == [back[split][i] for i in range(len(back[split]))]
    with pytest.raises(ConfigError) as ei:
        Dataset.from_hf("x", tmp_path / "dd", progress=False)
    assert_typed(ei, ConfigError, ValueError, "DatasetDict", "train", "test", "split=")
    # the folder is not read as JSONL any more (dataset_info.json, state.json)
    with pytest.raises(ConfigError):
        Dataset.from_path("x", tmp_path / "dd", progress=False)
    assert Dataset.from_path("x", tmp_path / "dd", split="test", progress=False).num_samples == 7


def hub_cache(root: Path) -> Path:
    """The hub cache layout: ``snapshots/<rev>/...`` links into ``blobs/``, ``refs/main``."""
    repo = root / "datasets--org--name"
    rev = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    splits = {"train": [rows(30), rows(25, 30)], "test": [rows(9, 500)]}
    for split, parts in splits.items():
        for k, part in enumerate(parts):
            rel = f"data/{split}-{k:05d}-of-{len(parts):05d}.parquet"
            blob = repo / "blobs" / f"{split}{k}"
            datasets.Dataset.from_dict(part).to_parquet(str(blob))
            link = repo / "snapshots" / rev / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "snapshots" / rev / "README.md").write_text("# card")
    return repo


def test_hub_cache_parquet_splits(tmp_path):
    repo = hub_cache(tmp_path)
    snap = next((repo / "snapshots").iterdir())
    for split in ("train", "test"):
        ours = Dataset.from_hf(split, repo, split=split, progress=False)
        files = sorted(str(p) for p in (snap / "data").glob(f"{split}-*"))
        theirs = datasets.load_dataset("parquet", data_files={split: files}, split=split,
                                       cache_dir=str(tmp_path / "hf"))
        assert [s.shard_id for s in ours.shards] == [os.path.relpath(f, snap) for f in files]
        assert everything(ours) == [theirs[i] for i in range(len(theirs))]
    assert Dataset.from_hf("t", snap, split="train", progress=False).num_samples == 55
    mine = Dataset.from_hf("t", repo, data_files={"x": "data/test-*"}, split="x", progress=False)
    assert mine.num_samples == 9 and mine.data_files == ("data/test-*",)
    with pytest.raises(ConfigError) as ei:
        Dataset.from_hf("v", repo, split="validation", progress=False)
    assert_typed(ei, ConfigError, ValueError, "validation", "train", "test")
    assert not any(p.name == "index.json" for p in repo.rglob("*"))


@pytest.mark.parametrize(
    "layout",
    [
        ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
         "data/validation-00000-of-00001.parquet"],
        ["train/a.parquet", "train/b.parquet", "test/c.parquet"],
        ["my_train.parquet", "my_test.parquet", "dev.parquet"],
        ["training-1.jsonl", "eval.jsonl"],
        ["all.parquet", "more/other.parquet"],
    ],
)
def test_split_conventions_match_datasets(tmp_path, layout):
    from datasets.data_files import DataFilesDict, get_data_patterns

    for rel in layout:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    ours = split_patterns(list_files(str(tmp_path)).files)
    theirs = get_data_patterns(str(tmp_path))
    assert sorted(ours) == sorted(theirs)
    resolved = DataFilesDict.from_patterns(theirs, base_path=str(tmp_path))
    files = list_files(str(tmp_path)).files
    for split, patterns in ours.items():
        from zephon_dask.data.paths import match_data_files

        mine = sorted(f.rel for f in match_data_files(files, patterns))
        want = sorted(os.path.relpath(p, tmp_path) for p in resolved[split])
        assert mine == want


def test_damaged_save_to_disk_folders(tmp_path):
    datasets.Dataset.from_dict(rows(40)).save_to_disk(str(tmp_path / "d"))
    arrow = next((tmp_path / "d").glob("*.arrow"))
    data = arrow.read_bytes()
    arrow.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_hf("d", tmp_path / "d", progress=False)
    assert_typed(ei, DataFormatError, ValueError, arrow.name, "truncated")
    (tmp_path / "d" / "state.json").write_text("{oops")
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_hf("d", tmp_path / "d", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "state.json", "save it again")
    (tmp_path / "d" / "state.json").write_text('{"_data_files": []}')
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_hf("d", tmp_path / "d", progress=False)
    assert_typed(ei, DataFormatError, ValueError, "_data_files")
