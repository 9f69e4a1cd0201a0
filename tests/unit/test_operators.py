"""The operator contract: per-record and chunk-batched record operators, and the shared validators."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import zephon_dask as z
from zephon_dask.core import compute_chunk, compute_window
from zephon_dask.errors import ConfigError, OperatorOutputError, ZephonError
from zephon_dask.operators.base import ChunkContext, RecordOp, Row
from zephon_dask.validate import check_choice, check_int


class ShoutPerRecord(RecordOp):
    """Upper-cases the text and drops records whose text has a digit 3, one record at a time."""

    name = "shout"

    def spec(self) -> dict:
        return {"op": self.name}

    def apply(self, record: dict) -> list[dict]:
        return [] if "3" in record["text"] else [{**record, "text": record["text"].upper()}]


class ShoutPerChunk(ShoutPerRecord):
    """The same operator, written for a whole chunk at once."""

    def apply(self, record: dict) -> list[dict]:
        raise AssertionError("a chunk-batched operator is never called per record")

    def apply_chunk(self, rows: list[Row], ctx: ChunkContext) -> list[Row]:
        texts = np.array([row.record["text"] for row in rows], dtype=object)
        keep = np.array(["3" not in t for t in texts], dtype=bool)
        upper = np.char.upper(texts[keep].astype(str)) if keep.any() else []
        kept = [row for row, k in zip(rows, keep.tolist(), strict=True) if k]
        ctx.count(f"{self.name}.dropped", len(rows) - len(kept))
        return [row._replace(record={**row.record, "text": str(t)}) for row, t in zip(kept, upper, strict=True)]


def _spec(first_op):
    docs = {f"s{s}": [f"doc {s}-{i} " + "abc " * (i % 7) for i in range(20)] for s in range(3)}
    ws = z.MixtureWorkSource([z.Dataset.from_records("d", docs)], chunk_size=8, seed=1)
    spec = z.Pipeline(ws).tokenize(max_length=12, split_long=True).shuffle(4).pack(32).options(
        canonical_replicas=2, flush_every_k_chunks=2).spec
    return dataclasses.replace(spec, record_ops=(first_op, *spec.record_ops))


def test_a_chunk_batched_operator_needs_nothing_else_and_matches_its_per_record_twin():
    per_record, per_chunk = _spec(ShoutPerRecord()), _spec(ShoutPerChunk())
    assert per_record.fingerprint == per_chunk.fingerprint
    for g in range(3):
        a, b = compute_chunk(per_record, g), compute_chunk(per_chunk, g)
        assert a.table.digest() == b.table.digest() and a.stats == b.stats
    dropped = 0
    for lane in range(2):
        for w in range(per_record.num_windows(lane)):
            a, b = compute_window(per_record, lane, w), compute_window(per_chunk, lane, w)
            assert a.digest() == b.digest() and a.stats == b.stats
            assert a.table.lineage[:, 3].max() > 0  # split pieces kept their token start
            dropped += a.stats["shout.dropped"]
    assert dropped > 0


def test_map_returning_a_non_dict_is_a_typed_error_naming_the_record():
    ws = z.MixtureWorkSource([z.Dataset.from_records("a", ["x", "y"])], chunk_size=2,
                             shuffle_within_shard=False)
    spec = z.Pipeline(ws).map(lambda r: r["text"]).tokenize().spec
    with pytest.raises(OperatorOutputError, match="returned str, not a dict") as info:
        compute_chunk(spec, 0)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ZephonError)
    assert "map failed on dataset 'a', shard 0, offset 0 (chunk 0)" in "\n".join(info.value.__notes__)


def test_map_counts_zero_drops_as_before():
    ws = z.MixtureWorkSource([z.Dataset.from_records("a", ["x", "y"])], chunk_size=2)
    out = compute_chunk(z.Pipeline(ws).map(lambda r: r).tokenize().spec, 0)
    assert out.stats == {"records": 2, "map.dropped": 0}


def test_check_int():
    assert check_int(np.int64(8), "n") == 8 and type(check_int(np.int64(8), "n")) is int
    assert check_int(0, "n", 0) == 0 and check_int(None, "n", optional=True) is None
    cases = [
        (dict(value=0, name="n"), "n=0 must be a positive integer"),
        (dict(value=True, name="n"), "n=True must be a positive integer"),
        (dict(value=2.0, name="n", minimum=0), "n=2.0 must be a non-negative integer"),
        (dict(value=1, name="n", minimum=2), "n=1 must be an integer >= 2"),
        (dict(value=258, name="eos_id", minimum=0, below=258, hint="a token id"),
         "eos_id=258 must be an integer in [0, 258) (a token id)"),
        (dict(value="4", name="buffer_size", optional=True, call="shuffle"),
         "shuffle(buffer_size='4') must be a positive integer or None"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError) as info:
            check_int(**kwargs)
        assert str(info.value) == message


def test_check_choice_compares_types():
    assert check_choice("wrap", ("wrap", "best_fit"), "algorithm") == "wrap"
    assert check_choice(None, (None, "stop"), "policy") is None
    with pytest.raises(ConfigError, match=r"labels=1 is unknown; choose one of False, True, 'hf'"):
        check_choice(1, (False, True, "hf"), "labels")
    with pytest.raises(ConfigError, match=r"pack\(algorithm=\['wrap'\]\) is unknown"):
        check_choice(["wrap"], ("wrap",), "algorithm", call="pack")
