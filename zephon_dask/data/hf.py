"""Hugging Face datasets on disk: ``save_to_disk`` folders, repository folders and the hub cache.

Pure apart from reading small metadata files and listing folders; no network.

- A ``save_to_disk`` folder holds ``state.json`` (its Arrow files, in order,
  under ``_data_files``, and its ``_split``) and ``dataset_info.json``; a
  ``DatasetDict`` folder holds ``dataset_dict.json`` (``{"splits": [...]}``) and
  one such folder per split. Every file ``state.json`` lists must be there, and
  they are read in its order, as ``datasets.load_from_disk`` reads them.
- A repository folder (a clone, or a hub cache snapshot, whose files are links
  into ``blobs/``) holds data files; a split is chosen by ``data_files`` globs or,
  by default, by the same conventions as ``datasets``: ``data/<split>-NNNNN-of-NNNNN*``
  file names, then a directory, then a file name holding a split keyword
  (``train``/``training``, ``validation``/``valid``/``dev``/``val``,
  ``test``/``testing``/``eval``/``evaluation``), else every file is ``train``.
- A hub cache folder (``datasets--<org>--<name>``) is resolved to the snapshot
  that ``refs/main`` names (or its only snapshot).
- A hub name (``org/name``, ``gpt2``) given where a local path belongs is never
  downloaded: :func:`not_downloaded` says how to download it first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import ConfigError, DataFormatError, DatasetNotFoundError
from .paths import FileInfo, file_etag, file_mtime, glob_regex, to_url

STATE = "state.json"
DATASET_DICT = "dataset_dict.json"
INFO = "dataset_info.json"
_SEP = "[-._ 0-9]"
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SHARDED = re.compile(r"data/([^/]+?)-\d{5}-of-\d{5}[^/]*\.[^/]*")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".pq", ".arrow", ".gz", ".zst", ".txt", ".model")


def looks_like_hub_id(path: object) -> bool:
    """Whether ``path`` (that does not exist) reads as a Hugging Face hub name, ``org/name`` or
    ``name``, rather than a mistyped path: no protocol, at most one ``/``, no file suffix. Pure."""
    if not isinstance(path, str) or not _HUB_ID.fullmatch(path) or path.startswith("."):
        return False
    return not path.lower().endswith(_DATA_SUFFIXES)


def not_downloaded(path: str, what: str) -> DatasetNotFoundError:
    """The error for a hub name (:func:`looks_like_hub_id`) given as a ``"tokenizer"`` or a
    ``"dataset"``: it does not exist here, and :func:`download_hint`."""
    return DatasetNotFoundError(f"{what} {path!r} does not exist here. {download_hint(path, what)}")


def download_hint(path: str, what: str) -> str:
    """Nothing is downloaded, and the two lines that download ``path`` (a ``"tokenizer"`` or a
    ``"dataset"``) with ``huggingface_hub`` and the local folder to pass instead. Pure."""
    if what == "tokenizer":
        fetch = f"folder = snapshot_download({path!r}, allow_patterns=['tokenizer*'])"
        use = "pipeline.tokenize(f'{folder}/tokenizer.json')  # or .tokenize_chat(folder)"
    else:
        fetch = f"folder = snapshot_download({path!r}, repo_type='dataset')  # allow_patterns= picks files"
        use = "Dataset.from_hf('name', folder, split='train')"
    return (
        "If it is a Hugging Face hub name: zephon_dask never downloads anything (a run must not "
        "depend on the network); download it once with huggingface_hub and pass the local folder:\n"
        f"    from huggingface_hub import snapshot_download\n    {fetch}\n    {use}"
    )


def _json(fs: AbstractFileSystem, path: str) -> Any:
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise DataFormatError(
            f"{path!r} is not valid JSON ({exc}); the Hugging Face dataset folder is damaged: "
            "save it again (save_to_disk)"
        ) from None


def is_saved(fs: AbstractFileSystem, directory: str) -> bool:
    """Whether ``directory`` is a ``save_to_disk`` folder (a Dataset or a DatasetDict)."""
    d = directory.rstrip("/")
    return bool(fs.isfile(f"{d}/{STATE}") or fs.isfile(f"{d}/{DATASET_DICT}"))


def saved_without_state(fs: AbstractFileSystem, directory: str) -> bool:
    """Whether ``directory`` looks like a ``save_to_disk`` folder that lost its ``state.json``:
    ``dataset_info.json`` beside Arrow files, and neither ``state.json`` nor ``dataset_dict.json``."""
    d = directory.rstrip("/")
    if is_saved(fs, d) or not fs.isfile(f"{d}/{INFO}"):
        return False
    return any(str(n).endswith(".arrow") for n in fs.ls(d, detail=False))


def missing_state(url: str) -> DataFormatError:
    """The error for a folder :func:`saved_without_state` recognises."""
    return DataFormatError(
        f"{url!r} holds {INFO} and Arrow files but no {STATE}: a save_to_disk folder whose "
        f"{STATE} is missing (it lists the Arrow files and their order), or a folder of another "
        "tool. Save the dataset again with save_to_disk, or read the Arrow files in name order "
        "with data_files='*.arrow' (or Dataset.from_arrow)"
    )


def saved_split(fs: AbstractFileSystem, directory: str, split: str | None, url: str) -> str:
    """The folder of ``split`` in a ``save_to_disk`` folder (itself for a single Dataset, whose
    ``state.json`` must then name ``split`` as its ``_split``)."""
    d = directory.rstrip("/")
    doc = _json(fs, f"{d}/{DATASET_DICT}")
    if doc is None:
        if split is not None:
            state = _json(fs, f"{d}/{STATE}")
            own = state.get("_split") if isinstance(state, dict) else None
            if split != own:
                raise ConfigError(
                    f"{url!r} is one saved Dataset, not a DatasetDict: it has no split {split!r} "
                    + (f"(its only split is {own!r}); " if isinstance(own, str) else "(it has no splits); ")
                    + "omit split=, or point at the DatasetDict folder that holds that split"
                )
        return d
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise DataFormatError(f"{url!r}: {DATASET_DICT} has no list of splits; save it again")
    if split is None and len(splits) == 1:
        split = splits[0]
    if split not in splits:
        raise ConfigError(
            f"{url!r} is a DatasetDict with splits {splits}; pass split=<one of them>"
            + ("" if split is None else f" (not {split!r})")
        )
    return f"{d}/{split}"


def saved_files(fs: AbstractFileSystem, directory: str, url: str) -> list[str]:
    """The Arrow file names of a ``save_to_disk`` Dataset folder, in their order."""
    state = _json(fs, f"{directory}/{STATE}")
    if state is None:
        raise DataFormatError(
            f"{url!r} has no {STATE} (the list of its Arrow files): the save_to_disk folder is "
            "incomplete; save the dataset again with save_to_disk"
        )
    files = state.get("_data_files") if isinstance(state, dict) else None
    names = [f.get("filename") for f in files] if isinstance(files, list) else None
    if not names or not all(isinstance(n, str) and "/" not in n for n in names):
        raise DataFormatError(
            f"{url!r}: {STATE} lists no Arrow data files (_data_files); save the dataset again "
            "with save_to_disk"
        )
    if state.get("_indices_data_files"):
        raise DataFormatError(
            f"{url!r} holds an indices mapping (a select/shuffle not flattened); save it again "
            "after dataset.flatten_indices()"
        )
    return names


def saved_file_infos(fs: AbstractFileSystem, directory: str, url: str) -> list[FileInfo]:
    """The Arrow files of a ``save_to_disk`` Dataset folder in ``state.json``'s order (one listing).

    Raises DataFormatError naming the files ``state.json`` lists that are missing.
    """
    names = saved_files(fs, directory, url)
    d = directory.rstrip("/")
    present = {str(i["name"]).rstrip("/").rsplit("/", 1)[-1]: i for i in fs.ls(d, detail=True)}
    missing = [n for n in names if n not in present]
    if missing:
        raise DataFormatError(
            f"{url!r}: {STATE} lists {len(names)} Arrow file(s), but {missing} "
            f"{'is' if len(missing) == 1 else 'are'} not in the folder; the save_to_disk folder "
            "is incomplete (an interrupted copy?): copy it again or save the dataset again"
        )
    out = []
    for n in names:
        info = present[n]
        if info.get("type") != "file":  # a symbolic link: follow it
            info = fs.info(f"{d}/{n}")
        out.append(FileInfo(f"{d}/{n}", to_url(fs, f"{d}/{n}"), n, int(info["size"]),
                            file_mtime(info), file_etag(info)))
    return out


def snapshot(fs: AbstractFileSystem, directory: str) -> str:
    """A hub cache folder (``snapshots/`` + ``refs/``) resolved to its snapshot; else ``directory``."""
    d = directory.rstrip("/")
    if not fs.isdir(f"{d}/snapshots"):
        return d
    try:
        rev = fs.cat_file(f"{d}/refs/main").decode().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        revs = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(f"{d}/snapshots", detail=False))
        if len(revs) != 1:
            raise ConfigError(
                f"{d!r} is a hub cache folder with snapshots {revs} and no refs/main; pass the "
                "folder of one snapshot (snapshots/<revision>)"
            ) from None
        rev = revs[0]
    return f"{d}/snapshots/{rev}"


def split_patterns(files: Sequence[FileInfo]) -> dict[str, list[str]]:
    """``{split: data_files globs}`` found among ``files`` by the ``datasets`` conventions. Pure."""
    rels = [f.rel for f in files]
    sharded = sorted({m.group(1) for r in rels if (m := _SHARDED.fullmatch(r))})
    if sharded:
        return {s: [f"data/{s}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"]
                for s in sharded}
    in_dir = ("**/{k}/**", "**/{k}" + _SEP + "*/**", "**/*" + _SEP + "{k}/**",
              "**/*" + _SEP + "{k}" + _SEP + "*/**")
    in_name = ("**/{k}" + _SEP + "*", "**/*" + _SEP + "{k}" + _SEP + "*")
    for bases in (in_dir, in_name):
        found = {}
        for split, keywords in SPLIT_KEYWORDS.items():
            patterns = [b.format(k=k) for k in keywords for b in bases]
            regexes = [glob_regex(p) for p in patterns]
            if any(r.fullmatch(rel) for r in regexes for rel in rels):
                found[split] = patterns
        if found:
            return found
    return {"train": ["**"]}


def choose(
    files: Sequence[FileInfo], split: str | None, data_files: Any, url: str
) -> tuple[str, list[str]]:
    """``(split, patterns)``: the ``data_files`` globs that pick ``split`` among ``files``.

    ``data_files`` is ``None`` (the default conventions), a glob, a list of globs, or
    ``{split: glob or list}`` as ``datasets.load_dataset`` takes it.
    """
    if data_files is None:
        table = split_patterns(files)
    elif isinstance(data_files, str):
        table = {split or "train": [data_files]}
    elif isinstance(data_files, Mapping):
        table = {str(k): [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    elif isinstance(data_files, Sequence) and all(isinstance(p, str) for p in data_files):
        table = {split or "train": list(data_files)}
    else:
        raise ConfigError(
            f"data_files must be a glob, a list of globs or a {{split: globs}} dict, got "
            f"{data_files!r}"
        )
    if split is None:
        split = "train" if "train" in table or len(table) != 1 else next(iter(table))
    if split not in table:
        raise ConfigError(
            f"{url!r} has no split {split!r}; its splits are {sorted(table)} (by "
            f"{'data_files' if data_files is not None else 'file names'}). Pass split=<one of "
            "them>, or data_files='<glob>' to choose the files yourself"
        )
    return split, table[split]
