"""Lance datasets (what ``lance.write_dataset`` writes: ``_versions/``, ``data/*.lance``), read in place.

A shard is one fragment, in the order of the dataset's fragments, its sample count
the fragment's live rows from the manifest (deleted rows excluded). The dataset is
pinned to the version current when it was opened: later writes (appends, deletions,
overwrites make new versions) change nothing read. Rows are fetched with the
fragment's ``take`` (Lance's range reads of the columns), sorted and deduplicated,
then put in the order asked. Each fragment's first data file's signature
(:mod:`zephon_dask.data.integrity`) is taken when the dataset is opened and checked
on every read, so a data file rewritten in place is refused like any other format's.
Reading needs the ``pylance`` package (``pip install 'zephon_dask[lance]'``); the
opened dataset is kept per process (:data:`OPENED`). Local paths and ``s3://`` URLs:
Lance's own object store reads the bucket, with the credentials and endpoint of the
fsspec ``storage_options`` translated (:func:`lance_options`). Pure apart from that
cache.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..errors import ConfigError, DataFormatError, DatasetNotFoundError
from . import integrity
from .memo import byte_lru
from .paths import NODE_CACHE_KEY, file_mtime, filesystem, fs_options, is_local, to_url
from .reader import Reader
from .shard import Shard

OPENED = byte_lru(8, lambda _: 1)


def _lance() -> Any:
    try:
        import lance
    except ImportError:
        raise ConfigError(
            "reading a Lance dataset needs the pylance package: pip install 'zephon_dask[lance]'"
        ) from None
    return lance


def is_folder(fs: Any, directory: str) -> bool:
    """Whether ``directory`` is a Lance dataset (a ``_versions`` folder holding manifests)."""
    versions = f"{directory.rstrip('/')}/_versions"
    try:
        return fs.isdir(versions) and any(str(n).endswith(".manifest") for n in fs.ls(versions, detail=False))
    except OSError:
        return False


def lance_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, str]:
    """Lance's object-store options for the fsspec ``storage_options`` of ``url`` (``s3://``):
    the key, secret and session token, the endpoint (``endpoint_url``, also in ``client_kwargs``;
    plain HTTP allowed when it is ``http://``), the region, anonymous access. Pure."""
    if "://" not in url:
        return {}
    opts = fs_options(url, storage_options)
    client = opts.get("client_kwargs") or {}
    out = {name: str(opts[key]) for key, name in (("key", "aws_access_key_id"),
                                                  ("secret", "aws_secret_access_key"),
                                                  ("token", "aws_session_token")) if opts.get(key)}
    endpoint = opts.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        out["aws_endpoint"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["allow_http"] = "true"
    region = client.get("region_name") or opts.get("region_name")
    if region:
        out["aws_region"] = str(region)
    elif endpoint:
        out["aws_region"] = "us-east-1"  # an S3-compatible server: any region signs
    if opts.get("anon"):
        out["aws_skip_signature"] = "true"
    return out


def _open(uri: str, version: int | None, options: dict[str, str]) -> Any:
    """The dataset at ``version`` (kept per process), or at its latest version (never kept)."""
    key = (uri, version, tuple(sorted(options.items())))
    ds = None if version is None else OPENED.get(key)
    if ds is None:
        try:
            ds = _lance().dataset(uri, version=version, storage_options=options or None)
        except (OSError, ValueError) as exc:
            if version is None:
                raise DatasetNotFoundError(f"Lance dataset {uri!r} cannot be opened ({exc})") from None
            raise DatasetNotFoundError(
                f"Lance dataset {uri!r}: version {version} cannot be opened ({exc}); it was read "
                "when the Dataset was built: restore it (do not clean up versions a run reads), "
                "or rebuild the Dataset"
            ) from None
        OPENED[(uri, int(ds.version), key[2])] = ds
    return ds


def open_dataset(
    path: str, storage_options: dict[str, Any] | None
) -> tuple[tuple[Shard, ...], dict[str, Any]]:
    """``(shards, meta)`` of a Lance dataset at its current version. No row is read.

    ``meta`` is ``{"uri", "version", "fragments": [fragment id per shard], "schema": [[name,
    Arrow type], ...]}``.
    """
    fs, root = filesystem(path, storage_options)
    root = root.rstrip("/")
    url = to_url(fs, root)
    if not is_local(fs) and "s3" not in ((fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol):
        raise ConfigError(
            f"Lance dataset {url!r}: zephon_dask reads Lance datasets from local paths and s3:// "
            "URLs; copy it there"
        )
    if (storage_options or {}).get(NODE_CACHE_KEY) is not None:
        raise ConfigError(
            f"Lance dataset {url!r}: storage_options {NODE_CACHE_KEY!r} does not apply to Lance "
            "datasets (Lance fetches the column ranges it reads itself); remove it"
        )
    if not fs.isdir(root) or not is_folder(fs, root):
        raise DatasetNotFoundError(f"Lance dataset {url!r} does not exist (no _versions/*.manifest)")
    ds = _open(url, None, lance_options(url, storage_options))
    version = int(ds.version)
    shards, ids = [], []
    for frag in ds.get_fragments():
        files = frag.data_files()
        if not files:
            raise DataFormatError(f"Lance dataset {url!r}: fragment {frag.fragment_id} has no data file")
        name = f"{root}/data/{files[0].path}"
        try:
            info = fs.info(name)
            sig = integrity.local(name) if is_local(fs) else integrity.from_info(info)
        except FileNotFoundError:
            raise DataFormatError(
                f"Lance dataset {url!r}: fragment {frag.fragment_id}'s data file {name!r} is "
                "missing; restore it or write the dataset again"
            ) from None
        n = int(frag.count_rows())
        shards.append(Shard(f"fragment-{frag.fragment_id}", to_url(fs, name), n, sig.size, file_mtime(info),
                            sig.mtime_ns, sig.etag, sig.fingerprint))
        ids.append(int(frag.fragment_id))
    if not shards:
        raise DataFormatError(f"Lance dataset {url!r} holds no fragments (no rows)")
    schema = [[f.name, str(f.type)] for f in ds.schema]
    return tuple(shards), {"uri": url, "version": version, "fragments": ids, "schema": schema}


def read(meta: dict[str, Any], index: int, shard: Shard, offsets: np.ndarray,
         storage_options: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows at ``offsets`` (int64, validated) of fragment ``index``, in order; fresh dicts each."""
    import pyarrow as pa  # here, not at import: the registry imports every format, threads none

    uniq, inverse = np.unique(offsets, return_inverse=True)
    ds = _open(meta["uri"], meta["version"], lance_options(meta["uri"], storage_options))
    try:
        table = ds.get_fragment(meta["fragments"][index]).take(uniq.tolist())
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataFormatError(
            f"Lance fragment {shard.shard_id!r} of {meta['uri']!r}: cannot read rows ({exc}); "
            "the dataset is damaged: write it again"
        ) from None
    if table.num_rows != uniq.size:
        raise DataFormatError(
            f"Lance fragment {shard.shard_id!r} of {meta['uri']!r}: {table.num_rows} rows read "
            f"for {uniq.size} asked; the dataset is damaged: write it again"
        )
    return fresh(table.to_pylist(), inverse.ravel().tolist())


def fresh(rows: list[dict[str, Any]], order: list[int]) -> list[dict[str, Any]]:
    """``rows[j]`` for each ``j`` of ``order``; a row asked again is a deep copy (no shared lists)."""
    seen: set[int] = set()
    out = []
    for j in order:
        out.append(copy.deepcopy(rows[j]) if j in seen else rows[j])
        seen.add(j)
    return out


def _read(dataset: Any, index: int, offsets: np.ndarray) -> list[dict[str, Any]]:
    return read(dataset.meta, index, dataset.shards[index], offsets, dataset.storage_options)


READER = Reader(
    "lance",
    "from_lance",
    _read,
    detect=is_folder,
    doc="Lance datasets (`lance.write_dataset`), local or `s3://`",
    identity=lambda dataset: {"lance": {k: dataset.meta[k] for k in ("version", "fragments", "schema")}},
    html=lambda dataset: [
        ("version", f"{dataset.meta['version']} (read at this version; later writes are not read)"),
        ("columns", ", ".join(f"{n} ({t})" for n, t in dataset.meta["schema"])),
    ],
)
