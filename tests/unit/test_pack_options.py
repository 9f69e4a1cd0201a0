"""``pack``'s options and kept fields against the slow reference packers of ``test_pack``.

The reference applies each option the obvious way around the plain reference algorithm:
documents filtered by length first, each group packed on its own (ascending value), rows
permuted last by a permutation drawn from ``SeedSequence``; ``max_sequences_per_bin`` makes a
bin holding that many pieces full. Kept fields ride with their documents: every lineage row of
the output carries the value of the document it came from.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_pack import _ref_row, ref_best_fit_wrap, ref_wrap, windows
from zephon_dask.errors import ConfigError
from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.pack import Pack
from zephon_dask.operators.table import SampleTable

ALGORITHMS = ("wrap", "first_fit", "best_fit", "best_fit_wrap")
BINS = ("first_fit", "best_fit")


def ref_bins_capped(docs, lineage, length, algorithm, pad_id, num_bins, most):
    """``test_pack.ref_bins`` with a bin of ``most`` pieces counted as having no room."""
    pieces = []
    for d, doc in enumerate(docs):
        for start in range(0, len(doc), length):
            pieces.append([(doc[i], d, i) for i in range(start, min(start + length, len(doc)))])

    def room(b):
        return 0 if most is not None and len(b) >= most else length - sum(len(p) for p in b)

    open_bins, emitted = [], []
    for piece in pieces:
        fitting = [j for j in range(len(open_bins)) if room(open_bins[j]) >= len(piece)]
        if fitting:
            j = fitting[0] if algorithm == "first_fit" else min(fitting, key=lambda k: room(open_bins[k]))
            open_bins[j].append(piece)
            continue
        if len(open_bins) == num_bins:
            j = min(range(len(open_bins)), key=lambda k: room(open_bins[k]))
            emitted.append(open_bins.pop(j))
        open_bins.append([piece])
    emitted.extend(open_bins)
    return emitted, {"pack.split_documents": sum(len(doc) > length for doc in docs)}


def ref_segments(docs, op):
    """Rows as lists of segments (lists of ``(token, doc, index)``) and the algorithm's stats."""
    length = op.max_length
    if op.algorithm in BINS:
        return ref_bins_capped(docs, None, length, op.algorithm, op.pad_id, op.num_bins, op.max_sequences_per_bin)
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    rows, stats = (ref_wrap if op.algorithm == "wrap" else ref_best_fit_wrap)(docs, lineage, length)
    # rebuild the segments from the reference rows' lineage: (doc, first index, count) per segment
    out, flat = [], 0
    for row in rows:
        segments = []
        for _, _, d, first, count in row["lineage"]:
            segments.append([(docs[d][first + k], d, first + k) for k in range(count)])
        out.append(segments)
        flat += 1
    return out, stats


def ref_pack_options(docs, lineage, values, op, seed=0, lane=0, window=0):
    """``(rows, stats)``: rows as ``test_pack._ref_row`` dicts plus ``values`` (one per lineage row)."""
    length = op.max_length
    stats = {"pack.documents": len(docs)}
    keep = list(range(len(docs)))
    if op.min_sequence_length is not None:
        stats["pack.short_documents"] = sum(len(docs[d]) < op.min_sequence_length for d in keep)
        keep = [d for d in keep if len(docs[d]) >= op.min_sequence_length]
    if op.drop_oversized:
        stats["pack.oversized_documents"] = sum(len(docs[d]) > length for d in keep)
        keep = [d for d in keep if len(docs[d]) <= length]
    groups = [keep] if op.groups is None or not keep else [
        [d for d in keep if values[d] == v] for v in sorted({values[d] for d in keep})]
    rows = []
    for members in groups:
        sub = [docs[d] for d in members]
        segs, sub_stats = ref_segments(sub, op)
        for k, v in sub_stats.items():
            stats[k] = stats.get(k, 0) + v
        group_rows = []
        for segments in segs:
            glob = [[(t, members[d], i) for t, d, i in s] for s in segments]
            row = _ref_row(glob, lineage, length, op.pad_id if op.algorithm in BINS else 0)
            row["values"] = [values[s[0][1]] for s in glob]
            group_rows.append(row)
        if op.groups is not None and keep:
            key = f"pack.group_rows.{values[members[0]]}"
            stats[key] = stats.get(key, 0) + len(group_rows)
        rows += group_rows
    stats["pack.rows"] = stats.get("pack.rows", 0) + len(rows)
    stats["pack.tokens"] = sum(t >= 0 for row in rows for t in row["document_ids"])
    stats["pack.slots"] = len(rows) * length
    if op.shuffle_bins and len(rows) > 1:
        tag = int.from_bytes(hashlib.sha256(b"pack.shuffle_bins").digest()[:8], "little")
        keys = np.random.SeedSequence([seed, tag, lane, window]).generate_state(8, dtype=np.uint64)
        order = np.random.Generator(np.random.PCG64([int(x) for x in keys])).permutation(len(rows))
        rows = [rows[i] for i in order]
    return rows, stats


def make_table(docs, lineage, values) -> SampleTable:
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in docs], dtype=np.int64)))
    tokens = np.array([t for d in docs for t in d], dtype=np.int64)
    return SampleTable.from_documents(tokens, offsets, np.array(lineage, np.int64).reshape(-1, 5),
                                      fields={"domain": np.asarray(values, np.int64)})


@st.composite
def packs(draw):
    algorithm = draw(st.sampled_from(ALGORITHMS))
    bins = algorithm in BINS
    return Pack(
        draw(st.integers(1, 12)), algorithm, pad_id=draw(st.integers(0, 9)),
        num_bins=draw(st.sampled_from([1, 2, 3, 64])) if bins else None,
        drop_oversized=draw(st.booleans()) if bins else False,
        max_sequences_per_bin=draw(st.sampled_from([None, 1, 2, 3])) if bins else None,
        min_sequence_length=draw(st.sampled_from([None, 1, 2, 5])),
        groups=draw(st.sampled_from([None, "domain"])),
        shuffle_bins=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(packs(), st.data(), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3))
def test_every_option_matches_the_reference(op, data, seed, lane, window):
    docs, lineage, _ = data.draw(windows(op.max_length))
    values = data.draw(st.lists(st.integers(0, 2), min_size=len(docs), max_size=len(docs)))
    ctx = WindowContext(seed=seed, lane=lane, window=window, dataset_names=("a", "b"))
    out = op.apply(make_table(docs, lineage, values), ctx)
    rows, stats = ref_pack_options(docs, lineage, values, op, seed, lane, window)
    assert ctx.stats == stats
    length = op.max_length
    assert out.offsets.tolist() == [r * length for r in range(len(rows) + 1)]
    for name in ("tokens", "positions", "document_ids"):
        assert getattr(out, name).tolist() == [x for row in rows for x in row[name]], name
    assert out.lineage.tolist() == [x for row in rows for x in row["lineage"]]
    kept = out.fields["domain"].tolist() if out.fields else []
    assert kept == [v for row in rows for v in row["values"]]
    if op.max_sequences_per_bin is not None:
        assert all(len(row["lineage"]) <= op.max_sequences_per_bin for row in rows)
    if op.groups is not None:
        assert all(len(set(row["values"])) == 1 for row in rows)


def test_max_sequences_per_bin_never_puts_three_documents_in_a_row():
    docs = [[1]] * 9 + [[2, 2]] * 4
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    for algorithm in BINS:
        op = Pack(16, algorithm, max_sequences_per_bin=2, num_bins=3)
        out = op.apply(make_table(docs, lineage, [0] * len(docs)), WindowContext(0, 0, 0, ("a",)))
        per_row = np.diff(out.lineage_offsets)
        assert per_row.max() == 2 and per_row.sum() == len(docs)


def test_drop_oversized_and_min_sequence_length_drop_and_count():
    docs = [[1] * 9, [2] * 3, [3], [4] * 4]
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    ctx = WindowContext(0, 0, 0, ("a",))
    out = Pack(4, "first_fit", drop_oversized=True, min_sequence_length=2).apply(
        make_table(docs, lineage, [0] * 4), ctx)
    assert out.tokens.tolist() == [2, 2, 2, 0, 4, 4, 4, 4]
    assert ctx.stats["pack.oversized_documents"] == 1 and ctx.stats["pack.short_documents"] == 1
    assert ctx.stats["pack.split_documents"] == 0


def test_options_are_refused_where_meaningless_and_absent_from_the_spec_when_unset():
    for option in ({"drop_oversized": True}, {"max_sequences_per_bin": 2}):
        for algorithm in ("wrap", "best_fit_wrap"):
            with pytest.raises(ConfigError, match="only applies to 'first_fit' and 'best_fit'"):
                Pack(8, algorithm, **option)
    with pytest.raises(ConfigError, match="max_sequences_per_bin=0"):
        Pack(8, "first_fit", max_sequences_per_bin=0)
    with pytest.raises(ConfigError, match="min_sequence_length"):
        Pack(8, min_sequence_length=-1)
    assert set(Pack(8).spec()) == {"op", "max_length", "algorithm", "pad_id", "num_bins"}
    assert Pack(8, groups="domain", shuffle_bins=True).spec()["groups"] == "domain"


def test_groups_need_the_field_kept():
    docs = [[1, 2]]
    table = SampleTable.from_documents(np.array([1, 2]), np.array([0, 2]), np.zeros((1, 5), np.int64))
    with pytest.raises(ConfigError, match="keep"):
        Pack(4, groups="domain").apply(table, WindowContext(0, 0, 0, ("a",)))
    assert docs


def test_kept_fields_survive_every_table_helper_and_a_stateful_pass_through():
    import pickle

    from zephon_dask.operators.stateful import Stateful

    docs = [[1, 2, 3], [4], [5, 6]]
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    table = make_table(docs, lineage, [7, 8, 9])
    plain = SampleTable.from_documents(table.tokens, table.offsets, table.lineage)
    assert plain.digest() != table.digest()  # fields hash; a table without them hashes as before
    assert table.take([2, 0]).fields["domain"].tolist() == [9, 7]
    assert table.slice(1, 3).fields["domain"].tolist() == [8, 9]
    assert SampleTable.concat([table, table.slice(0, 1)]).fields["domain"].tolist() == [7, 8, 9, 7]
    narrow, wide = table.narrowed()
    assert narrow.fields["domain"].dtype == np.int64 and narrow.widened(wide).digest() == table.digest()
    assert pickle.loads(pickle.dumps(narrow)).digest() == narrow.digest()
    through = Stateful("id", list, lambda state, sample: [sample], lambda state: []).apply(
        table, WindowContext(0, 0, 0, ("a",)))
    assert through.digest() == table.digest()


def test_groups_refuse_a_float_field():
    table = SampleTable.from_documents(np.array([1, 2]), np.array([0, 2]), np.zeros((1, 5), np.int64),
                                       fields={"score": np.array([0.5], np.float32)})
    with pytest.raises(ConfigError, match="int or bool field"):
        Pack(4, groups="score").apply(table, WindowContext(0, 0, 0, ("a",)))
