"""``Pack`` against a slow pure-Python reference packer, plus its properties."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_dask.errors import ConfigError
from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.pack import Pack
from zephon_dask.operators.table import SampleTable

BIN_ALGORITHMS = ("first_fit", "best_fit")
ALL_ALGORITHMS = ("wrap", *BIN_ALGORITHMS, "best_fit_wrap")


# --- reference: lists of ints, one token at a time -------------------------------------


def _ref_row(segments, lineage, length, pad_id):
    """One row from segments, each a list of ``(token, doc, index_in_doc)``."""
    row = {"tokens": [], "positions": [], "document_ids": [], "lineage": []}
    for doc_id, segment in enumerate(segments):
        for position, (token, _, _) in enumerate(segment):
            row["tokens"].append(token)
            row["positions"].append(position)
            row["document_ids"].append(doc_id)
        _, doc, first = segment[0]
        dataset, shard, offset, token_start, _ = lineage[doc]
        row["lineage"].append([dataset, shard, offset, token_start + first, len(segment)])
    while len(row["tokens"]) < length:
        row["tokens"].append(pad_id)
        row["positions"].append(0)
        row["document_ids"].append(-1)
    return row


def ref_wrap(docs, lineage, length):
    stream = [(token, d, i) for d, doc in enumerate(docs) for i, token in enumerate(doc)]
    n_rows = len(stream) // length
    rows = []
    for r in range(n_rows):
        segments = []
        for item in stream[r * length : (r + 1) * length]:
            if segments and segments[-1][-1][1] == item[1]:
                segments[-1].append(item)
            else:
                segments.append([item])
        rows.append(_ref_row(segments, lineage, length, 0))
    return rows, {"pack.dropped_tokens": len(stream) - n_rows * length}


def ref_bins(docs, lineage, length, algorithm, pad_id, num_bins):
    pieces = []
    for d, doc in enumerate(docs):
        for start in range(0, len(doc), length):
            pieces.append([(doc[i], d, i) for i in range(start, min(start + length, len(doc)))])

    def room(b):
        return length - sum(len(p) for p in b)

    open_bins, emitted = [], []
    for piece in pieces:
        fitting = [j for j in range(len(open_bins)) if room(open_bins[j]) >= len(piece)]
        if fitting:
            if algorithm == "first_fit":
                j = fitting[0]
            else:
                j = min(fitting, key=lambda k: room(open_bins[k]))
            open_bins[j].append(piece)
            continue
        if len(open_bins) == num_bins:
            j = min(range(len(open_bins)), key=lambda k: room(open_bins[k]))
            emitted.append(open_bins.pop(j))
        open_bins.append([piece])
    emitted.extend(open_bins)
    rows = [_ref_row(b, lineage, length, pad_id) for b in emitted]
    return rows, {"pack.split_documents": sum(len(doc) > length for doc in docs)}


def ref_best_fit_wrap(docs, lineage, length):
    """Row by row: the longest piece that fits (earliest document on ties), else cut the longest."""
    pool = [[(t, d, i) for i, t in enumerate(doc)] for d, doc in enumerate(docs) if doc]
    rows, cut = [], set()
    while sum(len(p) for p in pool) >= length:
        segments = []
        while sum(len(s) for s in segments) < length:
            room = length - sum(len(s) for s in segments)
            fitting = [p for p in pool if len(p) <= room]
            if fitting:
                piece = max(fitting, key=lambda p: (len(p), -p[0][1]))
                pool.remove(piece)
                segments.append(piece)
            else:
                piece = max(pool, key=lambda p: (len(p), -p[0][1]))
                pool.remove(piece)
                segments.append(piece[:room])
                pool.append(piece[room:])
                cut.add(piece[0][1])
        rows.append(_ref_row(segments, lineage, length, 0))
    return rows, {
        "pack.dropped_tokens": sum(len(p) for p in pool),
        "pack.split_documents": len(cut),
    }


def ref_pack(docs, lineage, op: Pack):
    if op.algorithm == "wrap":
        rows, stats = ref_wrap(docs, lineage, op.max_length)
    elif op.algorithm == "best_fit_wrap":
        rows, stats = ref_best_fit_wrap(docs, lineage, op.max_length)
    else:
        rows, stats = ref_bins(docs, lineage, op.max_length, op.algorithm, op.pad_id, op.num_bins)
    real = sum(t >= 0 for row in rows for t in row["document_ids"])
    stats |= {
        "pack.documents": len(docs),
        "pack.rows": len(rows),
        "pack.tokens": real,
        "pack.slots": len(rows) * op.max_length,
    }
    return rows, stats


# --- helpers --------------------------------------------------------------------------


def make_table(docs, lineage) -> SampleTable:
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in docs], dtype=np.int64)))
    tokens = np.array([t for d in docs for t in d], dtype=np.int64)
    return SampleTable.from_documents(tokens, offsets, np.array(lineage, np.int64).reshape(-1, 5))


def run(op: Pack, table: SampleTable) -> tuple[SampleTable, dict[str, int]]:
    ctx = WindowContext(seed=0, lane=0, window=0, dataset_names=("a", "b"))
    return op.apply(table, ctx), ctx.stats


def assert_matches_reference(out: SampleTable, stats, docs, lineage, op: Pack) -> None:
    rows, ref_stats = ref_pack(docs, lineage, op)
    length = op.max_length
    assert stats == ref_stats
    assert out.offsets.tolist() == [r * length for r in range(len(rows) + 1)]
    for field in ("tokens", "positions", "document_ids"):
        assert getattr(out, field).tolist() == [x for row in rows for x in row[field]], field
    assert out.lineage.tolist() == [x for row in rows for x in row["lineage"]]
    counts = np.cumsum([0] + [len(row["lineage"]) for row in rows]).tolist()
    assert out.lineage_offsets.tolist() == counts


@st.composite
def windows(draw, length=None):
    """``(docs, lineage, max_length)``: 0..10 documents of 0..3*max_length tokens."""
    if length is None:
        length = draw(st.integers(1, 12))
    docs = []
    for _ in range(draw(st.integers(0, 10))):
        n = draw(st.integers(0, 3 * length))
        docs.append(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)))
    lineage = [
        [
            draw(st.integers(0, 2)),
            draw(st.integers(0, 3)),
            7 * d + 1,
            draw(st.integers(0, 100)),
            len(doc),
        ]
        for d, doc in enumerate(docs)
    ]
    return docs, lineage, length


def token_multiset(table: SampleTable) -> Counter:
    """``(dataset, shard, offset, index in document, token)`` of every real token."""
    items = Counter()
    for i in range(len(table)):
        lo, hi = table.offsets[i], table.offsets[i + 1]
        tokens, ids = table.tokens[lo:hi], table.document_ids[lo:hi]
        for seg, (dataset, shard, offset, start, count) in enumerate(table.sample_lineage(i)):
            seg_tokens = tokens[ids == seg]
            assert len(seg_tokens) == count
            for k, token in enumerate(seg_tokens.tolist()):
                items[(dataset, shard, offset, start + k, token)] += 1
    return items


# --- wrap -----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(windows())
def test_wrap_matches_reference(window):
    docs, lineage, length = window
    op = Pack(length)
    out, stats = run(op, make_table(docs, lineage))
    assert_matches_reference(out, stats, docs, lineage, op)


@settings(max_examples=100, deadline=None)
@given(windows())
def test_wrap_conserves_tokens_except_the_reported_leftover(window):
    docs, lineage, length = window
    out, stats = run(Pack(length), make_table(docs, lineage))
    stream = [t for d in docs for t in d]
    assert np.all(out.lengths == length)
    assert np.all(out.document_ids >= 0)
    kept = len(out.tokens)
    assert stats["pack.dropped_tokens"] == len(stream) - kept < length
    assert out.tokens.tolist() == stream[:kept]


def test_wrap_example():
    docs = [[1, 2, 3], [], [4, 5, 6, 7, 8], [9]]
    lineage = [[0, 0, d, 10, len(doc)] for d, doc in enumerate(docs)]
    out, stats = run(Pack(4), make_table(docs, lineage))
    assert out.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert out.positions.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert out.document_ids.tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert out.lineage.tolist() == [[0, 0, 0, 10, 3], [0, 0, 2, 10, 1], [0, 0, 2, 11, 4]]
    assert out.lineage_offsets.tolist() == [0, 2, 3]
    assert stats["pack.dropped_tokens"] == 1


# --- first_fit / best_fit -------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    windows(),
    st.sampled_from(BIN_ALGORITHMS),
    st.sampled_from([1, 2, 3, 5, 64]),
    st.integers(0, 99),
)
def test_bins_match_reference(window, algorithm, num_bins, pad_id):
    docs, lineage, length = window
    op = Pack(length, algorithm, pad_id=pad_id, num_bins=num_bins)
    out, stats = run(op, make_table(docs, lineage))
    assert_matches_reference(out, stats, docs, lineage, op)


@settings(max_examples=100, deadline=None)
@given(windows(), st.sampled_from(BIN_ALGORITHMS), st.integers(1, 4))
def test_bins_keep_documents_whole_and_every_token_once(window, algorithm, num_bins):
    docs, lineage, length = window
    table = make_table(docs, lineage)
    out, stats = run(Pack(length, algorithm, pad_id=7, num_bins=num_bins), table)
    assert np.all(out.lengths == length)
    real = (out.document_ids >= 0).reshape(-1, length) if len(out) else np.zeros((0, length))
    # real tokens form a prefix of each row, never more than max_length, padding after
    assert np.all(real[:, 1:] <= real[:, :-1])
    assert np.all(out.tokens[out.document_ids < 0] == 7)
    assert np.all(out.positions[out.document_ids < 0] == 0)
    assert token_multiset(out) == token_multiset(table)
    segments = Counter(int(offset) for offset in out.lineage[:, 2])
    for doc, (_, _, offset, _, _) in zip(docs, lineage, strict=True):
        expected = -(-len(doc) // length)  # one segment per max_length piece; 1 if it fits
        assert segments[offset] == expected
    assert stats["pack.split_documents"] == sum(len(d) > length for d in docs)
    assert stats["pack.tokens"] == sum(len(d) for d in docs)


def test_first_fit_and_best_fit_differ_as_specified():
    # rooms after the first three docs (max_length 10): bin0 has 4, bin1 has 2
    docs = [[1] * 6, [2] * 8, [3] * 2]
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    table = make_table(docs, lineage)
    first, _ = run(Pack(10, "first_fit", num_bins=2), table)
    best, _ = run(Pack(10, "best_fit", num_bins=2), table)
    assert first.tokens.tolist() == [1] * 6 + [3] * 2 + [0] * 2 + [2] * 8 + [0] * 2
    assert best.tokens.tolist() == [1] * 6 + [0] * 4 + [2] * 8 + [3] * 2


def test_full_bins_close_fullest_first():
    docs = [[1, 1, 1], [2, 2], [3, 3, 3, 3]]  # max_length 4, two open bins
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    out, stats = run(Pack(4, "first_fit", num_bins=2), make_table(docs, lineage))
    # [3,3,3,3] fits nowhere: the fullest bin (room 1, [1,1,1]) is emitted first
    assert out.tokens.tolist() == [1, 1, 1, 0, 2, 2, 0, 0, 3, 3, 3, 3]
    assert stats["pack.rows"] == 3 and stats["pack.slots"] == 12 and stats["pack.tokens"] == 9


def test_huge_num_bins_costs_nothing_extra():
    docs = [[1, 2], [3], [4, 5, 6]]
    table = make_table(docs, [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)])
    huge, _ = run(Pack(4, "best_fit", num_bins=10**12), table)
    assert huge.digest() == run(Pack(4, "best_fit", num_bins=3), table)[0].digest()


# --- best_fit_wrap --------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(windows())
def test_best_fit_wrap_matches_reference(window):
    docs, lineage, length = window
    op = Pack(length, "best_fit_wrap")
    out, stats = run(op, make_table(docs, lineage))
    assert_matches_reference(out, stats, docs, lineage, op)


@settings(max_examples=100, deadline=None)
@given(windows())
def test_best_fit_wrap_rows_are_full_with_at_most_one_cut(window):
    docs, lineage, length = window
    table = make_table(docs, lineage)
    out, stats = run(Pack(length, "best_fit_wrap"), table)
    assert np.all(out.lengths == length)
    assert np.all(out.document_ids >= 0)
    assert stats["pack.tokens"] + stats["pack.dropped_tokens"] == sum(map(len, docs))
    assert stats["pack.dropped_tokens"] < length
    # a row holds at most one head that is not its document's end (the cut)
    doc_len = {int(offset): len(doc) for doc, (_, _, offset, _, _) in zip(docs, lineage, strict=True)}
    first = {int(offset): start for _, _, offset, start, _ in lineage}
    for i in range(len(out)):
        cuts = sum(
            start - first[offset] + count < doc_len[offset]
            for _, _, offset, start, count in out.sample_lineage(i).tolist()
        )
        assert cuts <= 1
    kept = token_multiset(out)
    assert not kept - token_multiset(table)  # every kept token comes from the input, once


def test_best_fit_wrap_example():
    docs = [[1] * 5, [2] * 7, [3] * 2, [4] * 3, [5] * 6, [6] * 1, [7] * 9]
    lineage = [[0, 0, d, 0, len(doc)] for d, doc in enumerate(docs)]
    out, stats = run(Pack(8, "best_fit_wrap"), make_table(docs, lineage))
    # max_length 8: 7 + 1, 6 + 2, 5 + 3, then 9 fits nowhere: its head fills the last row
    # and its 1-token tail is left over (dropped)
    assert out.tokens.tolist() == [2] * 7 + [6] + [5] * 6 + [3] * 2 + [1] * 5 + [4] * 3 + [7] * 8
    assert out.lineage[:, 3].tolist() == [0, 0, 0, 0, 0, 0, 0]
    assert stats["pack.dropped_tokens"] == 1 and stats["pack.split_documents"] == 1
    assert stats["pack.rows"] == 4


# --- all algorithms -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 10).flatmap(lambda n: st.tuples(windows(n), windows(n))),
    st.sampled_from(ALL_ALGORITHMS),
)
def test_no_state_between_calls(pair, algorithm):
    (docs_a, lineage_a, length), (docs_b, lineage_b, _) = pair
    op = Pack(length, algorithm, num_bins=2 if algorithm in BIN_ALGORITHMS else None)
    ctx = WindowContext(seed=0, lane=0, window=0, dataset_names=())
    op.apply(make_table(docs_a, lineage_a), ctx)
    after, stats_after = run(op, make_table(docs_b, lineage_b))
    alone, stats_alone = run(
        Pack(length, algorithm, num_bins=op.num_bins), make_table(docs_b, lineage_b)
    )
    assert after.digest() == alone.digest()
    assert stats_after == stats_alone


@pytest.mark.parametrize("algorithm", ALL_ALGORITHMS)
def test_zero_length_documents_contribute_nothing(algorithm):
    docs = [[], [1, 2], [], [], [3, 4, 5], []]
    lineage = [[1, 2, d, 5, len(doc)] for d, doc in enumerate(docs)]
    kept = [i for i, d in enumerate(docs) if d]
    out, stats = run(Pack(3, algorithm), make_table(docs, lineage))
    without, stats_without = run(
        Pack(3, algorithm), make_table([docs[i] for i in kept], [lineage[i] for i in kept])
    )
    assert out.digest() == without.digest()
    assert stats["pack.documents"] == 6 and stats_without["pack.documents"] == 2


@pytest.mark.parametrize("algorithm", ALL_ALGORITHMS)
@pytest.mark.parametrize("table", [SampleTable.empty(), make_table([[], []], [[0] * 5, [0] * 5])])
def test_empty_input_gives_an_empty_table(algorithm, table):
    out, stats = run(Pack(4, algorithm), table)
    assert len(out) == 0 and out.tokens.size == 0 and out.lineage.shape == (0, 5)
    assert out.offsets.tolist() == [0] and out.lineage_offsets.tolist() == [0]
    assert stats["pack.rows"] == stats["pack.tokens"] == stats["pack.slots"] == 0


@pytest.mark.parametrize("algorithm", ALL_ALGORITHMS)
@pytest.mark.parametrize("dtype", [np.uint16, np.int64])
def test_token_dtype_is_preserved(algorithm, dtype):
    int32 = make_table([[1, 2, 3], [4, 5]], [[0, 0, 0, 0, 3], [0, 0, 1, 0, 2]])
    out, _ = run(Pack(2, algorithm), dataclasses.replace(int32, tokens=int32.tokens.astype(dtype)))
    assert out.tokens.dtype == dtype
    assert out.tokens.tolist() == run(Pack(2, algorithm), int32)[0].tokens.tolist()


def test_pad_id_must_fit_the_token_dtype():
    table = make_table([[1, 2, 3]], [[0, 0, 0, 0, 3]])
    table = dataclasses.replace(table, tokens=table.tokens.astype(np.uint16))
    with pytest.raises(ConfigError, match="70000"):
        run(Pack(4, "best_fit", pad_id=70_000), table)


def test_rejects_already_packed_input():
    docs = [[1, 2, 3], [4, 5, 6]]
    packed, _ = run(Pack(4), make_table(docs, [[0, 0, 0, 0, 3], [0, 0, 1, 0, 3]]))
    with pytest.raises(ConfigError, match="one lineage row"):
        run(Pack(4, "first_fit"), packed)


def test_spec_is_json_native():
    assert Pack(8).spec() == {
        "op": "pack",
        "max_length": 8,
        "algorithm": "wrap",
        "pad_id": 0,
        "num_bins": None,
    }
    spec = Pack(np.int64(8), "best_fit", pad_id=np.int32(3)).spec()
    assert json.loads(json.dumps(spec)) == spec
    assert spec == {
        "op": "pack",
        "max_length": 8,
        "algorithm": "best_fit",
        "pad_id": 3,
        "num_bins": 64,
    }
    assert Pack(8, "first_fit", num_bins=2).spec()["num_bins"] == 2
    assert Pack.name == "pack"


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"max_length": 0}, "max_length=0"),
        ({"max_length": -3}, "max_length=-3"),
        ({"max_length": True}, "max_length=True"),
        ({"max_length": 2.0}, "max_length=2.0"),
        ({"max_length": 8, "algorithm": "greedy"}, "'greedy'"),
        ({"max_length": 8, "pad_id": -1}, "pad_id=-1"),
        ({"max_length": 8, "pad_id": False}, "pad_id=False"),
        ({"max_length": 8, "num_bins": 4}, "num_bins=4"),
        ({"max_length": 8, "algorithm": "best_fit_wrap", "num_bins": 4}, "num_bins=4"),
        ({"max_length": 8, "algorithm": "first_fit", "num_bins": 0}, "num_bins=0"),
        ({"max_length": 8, "algorithm": "best_fit", "num_bins": True}, "num_bins=True"),
    ],
)
def test_validation_errors_are_typed_and_name_the_value(kwargs, shown):
    with pytest.raises(ConfigError) as info:
        Pack(**kwargs)
    assert isinstance(info.value, ValueError)
    assert shown in str(info.value)


def test_unknown_algorithm_lists_the_choices():
    with pytest.raises(ValueError, match="'wrap', 'first_fit', 'best_fit', 'best_fit_wrap'"):
        Pack(8, "greedy")


def test_the_packing_order_example_in_the_docs_prints_what_the_docs_show():
    """docs/operators.md, "How each packing algorithm orders and splits": its snippet, run here."""
    import contextlib
    import io
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operators.md").read_text()
    section = text.split("## How each packing algorithm orders and splits", 1)[1].split("\n## ", 1)[0]
    code, shown = re.search(r"```python\n(.*?)```\s*```text\n(.*?)```", section, re.S).groups()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/operators.md", "exec"), {})
    assert out.getvalue() == shown
