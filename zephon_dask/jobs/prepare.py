"""``prepare_tokens``: tokenize a dataset once, on a Dask cluster, into a zarr token store.

:func:`prepare_tokens` is the driver: it checks its inputs, creates (or
resumes) the store, runs one task per input shard and marks the store complete
once every shard is written and verified; it holds the client and the progress
bar. The tasks, :func:`tokenize_shard` and :func:`check_shard`, are functions
of ``(dataset, Tokenize operator, shard)`` that write or read only their own
``shards/<id>`` group, so no two workers ever touch the same zarr chunk; the
same inputs write the same bytes. Tokenization is the operator's
``encode_documents``, the pipeline's own code, so a pipeline over the store
packs exactly what the same pipeline tokenizing the text with that operator
would. See ``docs/prepare.md``.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..data.dataset import Dataset
from ..data.paths import filesystem, to_url
from ..data.shard import Shard
from ..data.tokens import FORMAT, RECORD, VERSION, ShardWriter, array_at, verify_shard, zarr_options
from ..errors import ConfigError, DataFormatError, MissingFieldError, TokenizerMismatchError
from ..execution.connect import connect, each_completed
from ..operators.identity import sha256_json
from ..operators.tokenize import Tokenize
from ..progress_bar import progress_bar
from ..validate import check_int

DOCS_PER_READ = 8192  # documents read and tokenized at a time inside a shard task


@dataclass(frozen=True)
class PrepareReport:
    """What one :func:`prepare_tokens` call did (a value).

    ``computed`` are the store shard ids tokenized by this call, ``reused`` those
    found complete and verified; ``num_docs``/``num_tokens`` count the whole store.
    """

    path: str
    dataset: Dataset
    computed: tuple[str, ...]
    reused: tuple[str, ...]
    num_docs: int
    num_tokens: int
    truncated_tokens: int
    seconds: float


def store_shard_ids(n: int) -> list[str]:
    """Store shard ids for ``n`` input shards: zero-padded indices, so they sort like the input. Pure."""
    width = max(5, len(str(n - 1)))
    return [f"{i:0{width}d}" for i in range(n)]


def token_dtype(op: Tokenize) -> np.dtype:
    """uint16 when the tokenizer's vocabulary (and BOS/EOS ids) fit, else uint32. Pure."""
    vocab = getattr(op.tokenizer, "vocab_size", None)
    if vocab is None:  # a callable tokenizer: its range is unknown
        return np.dtype(np.uint32)
    top = max(vocab - 1, op.bos_id or 0, op.eos_id or 0)
    return np.dtype(np.uint16 if top < 2**16 else np.uint32)


def _source(shard: Shard) -> dict[str, Any]:
    """The input shard a store shard was made from, as its completion record names it."""
    return {
        "shard_id": shard.shard_id,
        "num_samples": shard.num_samples,
        "size_bytes": shard.size_bytes,
        "mtime": shard.mtime,
    }


def _texts(dataset: Dataset, index: int, start: int, records: list, field: str) -> list:
    texts = []
    for j, rec in enumerate(records):
        if field not in rec:
            raise MissingFieldError(
                f"dataset {dataset.name!r}, shard {dataset.shards[index].shard_id!r}, offset "
                f"{start + j}: the record has no field {field!r} (fields: {sorted(rec)}); pass field="
            )
        texts.append(rec[field])
    return texts


def tokenize_shard(
    dataset: Dataset, op: Tokenize, dtype: str, storage_options: dict | None,
    index: int, url: str, source: dict[str, Any],
) -> dict[str, Any]:
    """Tokenize input shard ``index`` into the group at ``url``, verify it, return its record.

    Writes only that group (emptied first, so a partial earlier attempt is dropped);
    the same inputs write the same bytes. A group that already verifies for ``source``
    is returned untouched, so a rerun of a finished task (its worker died after
    writing) never empties a shard another process may be reading.
    """
    record = verify_shard(url, source, dtype, storage_options)
    if record is not None:
        return record
    writer = ShardWriter(url, dtype, storage_options)
    n = dataset.shards[index].num_samples
    truncated = 0
    for lo in range(0, n, DOCS_PER_READ):
        records = dataset.read(index, np.arange(lo, min(n, lo + DOCS_PER_READ)))
        arrays, _, _, cut = op.encode_documents(_texts(dataset, index, lo, records, op.field))
        writer.add(arrays)
        truncated += cut
    writer.close(source, truncated)
    record = verify_shard(url, source, dtype, storage_options)
    if record is None:
        raise DataFormatError(
            f"token shard {url!r} does not read back as it was written; check the storage "
            "(another writer, a full disk) and rerun prepare_tokens"
        )
    return record


def check_shard(
    dataset: Dataset, op: Tokenize, dtype: str, storage_options: dict | None,
    index: int, url: str, source: dict[str, Any],
) -> dict[str, Any] | None:
    """The record of the group at ``url`` if it was made from ``source`` and verifies, else None. Reads only."""
    return verify_shard(url, source, dtype, storage_options)


def _check_inputs(dataset: Any, tokenize: Any) -> None:
    """Raise unless ``dataset`` is raw text and ``tokenize`` a Tokenize operator that fits it."""
    if not isinstance(dataset, Dataset):
        raise ConfigError(
            f"prepare_tokens needs a zephon_dask.Dataset, got {type(dataset).__name__}; build one "
            "with Dataset.from_jsonl/from_parquet/from_path"
        )
    if dataset.holds_tokens:
        raise ConfigError(
            f"dataset {dataset.name!r} is already a token store; prepare_tokens reads JSONL, "
            "parquet or in-memory records"
        )
    if not isinstance(tokenize, Tokenize):
        raise ConfigError(
            f"prepare_tokens needs a Tokenize operator, got {type(tokenize).__name__}; build one "
            "with zephon_dask.Tokenize(tokenizer, field=..., bos=..., eos=..., max_length=...), "
            "the arguments of Pipeline.tokenize"
        )
    if tokenize.name != "tokenize":
        raise ConfigError(
            f"prepare_tokens cannot use {type(tokenize).__name__}: a token store keeps token ids only, "
            "not the loss masks of tokenize_chat; tokenize conversations in the pipeline"
        )
    if tokenize.split_long:
        raise ConfigError(
            "prepare_tokens cannot use a Tokenize with split_long=True: a token store keeps one "
            "document per record; drop split_long (max_length then truncates)"
        )
    first = next(i for i, s in enumerate(dataset.shards) if s.num_samples)
    _texts(dataset, first, 0, dataset.read(first, [0]), tokenize.field)  # a wrong field fails here


def _existing(fs, fpath: str, out: str, target: dict[str, Any]) -> dict[str, Any] | None:
    """The root attributes of the token store at ``out`` to resume, or None for a new store.

    Raises for a file, a non-empty directory that is not a token store, or a store of
    another tokenizer, dataset or setting.
    """
    if not fs.exists(fpath):
        return None
    if not fs.isdir(fpath):
        raise ConfigError(f"out={out!r} is a file; give a new or empty directory for the token store")
    meta = f"{fpath.rstrip('/')}/zarr.json"
    if not fs.isfile(meta):
        if fs.ls(fpath):
            raise ConfigError(
                f"out={out!r} is a non-empty directory but not a token store; give a new or "
                "empty path (prepare_tokens never deletes data it did not write)"
            )
        return None
    try:
        attrs = json.loads(fs.cat_file(meta)).get("attributes", {})
    except ValueError:
        attrs = {}
    if attrs.get("format") != FORMAT:
        raise ConfigError(
            f"out={out!r} is a zarr store but not a zephon_dask token store "
            f"(format={attrs.get('format')!r}); give a new or empty path"
        )
    differ = sorted(k for k in target if k != "complete" and attrs.get(k) != target[k])
    if "tokenizer" in differ:
        raise TokenizerMismatchError(
            f"out={out!r} holds a token store made with other tokenize settings "
            f"({attrs.get('tokenizer')!r}, not {target['tokenizer']!r}); delete it or give "
            "another out path"
        )
    if differ:
        raise ConfigError(
            f"out={out!r} holds a token store whose {differ} differ from this job's (another "
            "dataset, or its files changed); delete it or give another out path"
        )
    return attrs


def _bounds(tokenize: Tokenize, records: Any) -> dict[str, int]:
    """The id bounds a finished store records: the tokenizer's ``vocab_size`` (when known) and the
    largest id (when every shard's record has it; shards from before it was recorded do not). Pure."""
    out = {} if tokenize.vocab_size is None else {"vocab_size": int(tokenize.vocab_size)}
    tops = [r.get("max_id") for r in records]
    if tops and all(isinstance(t, int) for t in tops):
        out["max_id"] = max(tops)
    return out


def _in_process(fs) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "memory" in protocols


def _run_tasks(client, fn, shared: tuple, todo: list[int], calls: list[tuple], keys: list[str],
               ids: list[str], shared_key: str, desc: str, progress: bool) -> dict[int, Any]:
    """Run ``fn`` for the shards ``todo`` with a progress bar; results by shard index.

    Every task runs to its end; then the error of the first failed shard (in shard
    order) is raised, so the shards that did succeed are kept for a rerun.
    """
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    docs = tokens = 0
    t0 = time.perf_counter()
    bar = progress_bar(total=len(todo), desc=desc, unit="shard", disable=None if progress else True)
    tasks = each_completed(client, fn, shared, [calls[i] for i in todo], [keys[i] for i in todo],
                           shared_key)
    with bar, closing(tasks):
        for j, result, error in tasks:
            i = todo[j]
            if error is not None:
                errors[i] = error
            else:
                results[i] = result
                if result is not None:
                    docs += result["num_docs"]
                    tokens += result["num_tokens"]
            rate = max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{docs / rate:,.0f} docs/s, {tokens / rate:,.0f} tokens/s",
                                refresh=False)
            bar.update()
    if errors:
        i = min(errors)
        exc = errors[i]
        exc.add_note(
            f"zephon_dask: {desc}: store shard {ids[i]} (input {calls[i][2]['shard_id']!r}) failed; "
            f"{len(errors)} of {len(todo)} shards failed, the others are kept. The store stays "
            "incomplete: fix the cause and rerun prepare_tokens to finish it"
        )
        raise exc
    return results


def _check_visible(url: str, ids: list[str], records: dict[int, dict], opts: dict | None) -> None:
    """Raise unless this process sees every shard's record and arrays as the workers wrote them."""
    root = zarr.open_group(url, mode="r", storage_options=opts)
    for i, sid in enumerate(ids):
        rec = records[i]
        try:
            group = root[f"shards/{sid}"]
            seen = (
                group.attrs.get(RECORD) == rec
                and array_at(root, f"shards/{sid}/tokens").shape == (rec["num_tokens"],)
                and array_at(root, f"shards/{sid}/offsets").shape == (rec["num_docs"] + 1,)
            )
        except KeyError:
            seen = False
        if not seen:
            raise DataFormatError(
                f"token store {url!r}: shard {sid} as written by the workers is not visible here; "
                "out must be storage that the workers and this process share (a memory:// store "
                "needs workers that are threads of this process)"
            )


def prepare_tokens(
    dataset: Dataset,
    tokenize: Tokenize,
    out: str,
    *,
    n_workers: int | None = None,
    address: str | None = None,
    client: Any = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> PrepareReport:
    """Tokenize every document of ``dataset`` with ``tokenize``, on a Dask cluster, into a store at ``out``.

    ``tokenize`` is the pipeline's :class:`~zephon_dask.operators.Tokenize` operator,
    e.g. ``Tokenize("tokenizer.json", field="text", bos=True, eos=True)``: the store
    holds what ``Pipeline.tokenize`` with the same arguments would produce
    (``split_long=True`` is refused: a store keeps one document per record).
    Runs on ``client``, on the scheduler at ``address``, or on an embedded
    ``LocalCluster`` of ``n_workers`` processes (threads of this process when ``out``
    or the data is ``memory://``, which worker processes cannot share). ``out`` is a
    local path or fsspec URL (``storage_options`` for its filesystem).

    Resumable: on an existing store of the same dataset and settings, shards whose
    completion record and checksums verify are kept and the others written again;
    the store reads as complete only once every shard is verified. Returns a
    :class:`PrepareReport`; raises the first failed shard's error (the store stays
    incomplete).

    Example:
        >>> from zephon_dask import Dataset, Tokenize, prepare_tokens  # doctest: +SKIP
        >>> report = prepare_tokens(Dataset.from_jsonl("web", "data/web/"),  # doctest: +SKIP
        ...                         Tokenize("tokenizer.json", eos=True), "tokens/web.zarr")
        >>> web = Dataset.from_tokens("web", "tokens/web.zarr")  # doctest: +SKIP
    """
    t0 = time.perf_counter()
    n_workers = check_int(n_workers, "n_workers", 1, optional=True, hint="None: one per core")
    _check_inputs(dataset, tokenize)
    fs, fpath = filesystem(str(out), storage_options)
    url = to_url(fs, fpath.rstrip("/"))
    dtype = token_dtype(tokenize).name
    ids = store_shard_ids(dataset.num_shards)
    target = json.loads(json.dumps({
        "format": FORMAT, "version": VERSION, "complete": False, "tokenizer": tokenize.spec(),
        "dtype": dtype, "shards": ids, "source": dataset.identity(),
    }))
    existing = _existing(fs, fpath, str(out), target)
    calls = [(i, f"{url}/shards/{sid}", json.loads(json.dumps(_source(shard))))
             for i, (sid, shard) in enumerate(zip(ids, dataset.shards, strict=True))]
    fp = sha256_json({"url": url, **target})[:16]

    def run(client, fn, todo: list[int], kind: str, desc: str) -> dict[int, Any]:
        once = uuid.uuid4().hex[:8]  # keys of this run only: the store may have changed since the last
        keys = [f"zephon-{kind}-shard-{fp}-{once}-{i}" for i in range(len(ids))]
        return _run_tasks(client, fn, (dataset, tokenize, dtype, storage_options), todo, calls, keys, ids,
                          f"zephon-prepare-{fp}-{once}", f"{desc} {dataset.name}", progress)

    opts = zarr_options(str(out), storage_options)
    first = dataset.shards[0].path
    local = _in_process(fs) or (
        first is not None and _in_process(filesystem(first, dataset.storage_options)[0])
    )
    records: dict[int, dict[str, Any]] = {}
    with connect(client, address, n_workers, processes=not local) as c:
        if existing is not None:
            checked = run(c, check_shard, list(range(len(ids))), "verify", "verifying")
            records = {i: r for i, r in checked.items() if r is not None}
        todo = [i for i in range(len(ids)) if i not in records]
        if existing is None:
            root = zarr.open_group(url, mode="w", attributes=target, storage_options=opts)
            root.create_group("shards")
        elif todo and existing.get("complete") is not False:
            zarr.open_group(url, mode="r+", storage_options=opts).attrs.update({"complete": False})
        if todo:
            records.update(run(c, tokenize_shard, todo, "tokenize", "tokenizing"))
    if todo or existing is None or existing.get("complete") is not True:
        _check_visible(url, ids, records, opts)
        zarr.open_group(url, mode="r+", storage_options=opts).attrs.update(
            {"complete": True, **_bounds(tokenize, records.values())})
    return PrepareReport(
        url,
        Dataset.from_tokens(dataset.name, url, storage_options=storage_options),
        tuple(ids[i] for i in todo),
        tuple(ids[i] for i in range(len(ids)) if i not in todo),
        sum(r["num_docs"] for r in records.values()),
        sum(r["num_tokens"] for r in records.values()),
        sum(r["truncated_tokens"] for r in records.values()),
        time.perf_counter() - t0,
    )
