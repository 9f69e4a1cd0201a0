"""In-memory record shards.

Records are validated and frozen at construction as JSON text (so they behave
exactly like a JSONL dataset with the same content: tuples read back as lists,
non-string keys as strings), which makes them deeply immutable, cheap to pickle
and content-hashable. Each shard's ``sha256`` is taken over its records' canonical
JSON (``sort_keys``), one per line. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, DataFormatError
from . import fields
from .reader import Reader


def freeze(
    data: Any, text_field: str, dataset: str
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """``(shard ids, JSON lines per shard, sha256 per shard)``, shards sorted by id.

    ``data`` is a list of records (one shard ``"0"``) or a ``{shard_id: records}``
    mapping; a record is a dict holding ``text_field`` or a plain string.
    """
    if isinstance(data, Mapping):
        items = [(str(k), v) for k, v in data.items()]
        ids = [k for k, _ in items]
        if len(set(ids)) != len(ids):
            raise ConfigError(
                f"dataset {dataset!r}: shard ids {sorted(ids)} collide once converted to str"
            )
        items.sort(key=lambda kv: kv[0])
    elif isinstance(data, (list, tuple)):
        items = [("0", data)]
    else:
        raise ConfigError(
            f"dataset {dataset!r}: records must be a list of dicts/strings or a "
            f"{{shard_id: list}} mapping, got {type(data).__name__}"
        )
    lines, hashes = [], []
    for sid, recs in items:
        if isinstance(recs, (str, bytes, Mapping)) or not isinstance(recs, Iterable):
            raise ConfigError(
                f"dataset {dataset!r}: shard {sid!r} must be a list of records, "
                f"got {type(recs).__name__}"
            )
        shard_lines, digest = [], hashlib.sha256()
        for i, rec in enumerate(recs):
            text, canonical = _freeze_one(rec, i, sid, text_field, dataset)
            shard_lines.append(text)
            digest.update(canonical.encode())
            digest.update(b"\n")
        lines.append(tuple(shard_lines))
        hashes.append(digest.hexdigest())
    return tuple(k for k, _ in items), tuple(lines), tuple(hashes)


def _freeze_one(rec: Any, i: int, sid: str, text_field: str, dataset: str) -> tuple[str, str]:
    where = f"dataset {dataset!r}: shard {sid!r}, record {i}"
    if isinstance(rec, str):
        rec = {text_field: rec}
    elif not isinstance(rec, Mapping):
        raise DataFormatError(f"{where} is a {type(rec).__name__}; expected a dict or a str")
    elif text_field not in rec:
        raise fields.missing(dataset, f"shard {sid!r}, record {i}", text_field, list(map(str, rec)),
                             "Pass text_field=<one of them> to Dataset.from_records")
    try:
        text = json.dumps(rec, ensure_ascii=False)
        canonical = json.dumps(rec, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"{where} is not JSON-serialisable ({exc})") from None
    try:
        canonical.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = canonical[exc.start : exc.end]
        raise DataFormatError(
            f"{where} holds {bad!r}, a lone surrogate (half of a UTF-16 pair: text that is not valid "
            f"Unicode, often from a bad decode), at character {exc.start} of its JSON "
            f"{canonical[max(0, exc.start - 30) : exc.start + 10]!r}; fix the text, e.g. "
            "s.encode('utf-8', 'replace').decode('utf-8')"
        ) from None
    return text, canonical


def read(lines: tuple[str, ...], offsets: np.ndarray) -> list[dict[str, Any]]:
    """The records at ``offsets`` (validated) of one shard, in order; fresh dicts each."""
    return [json.loads(lines[i]) for i in offsets.tolist()]


READER = Reader(
    "records",
    "from_records",
    lambda dataset, index, offsets: read(dataset.memory_records[index], offsets),
    shard_identity=lambda dataset, index: {"sha256": dataset.memory_sha256[index]},
    doc="in-memory lists of dicts or strings",
)
