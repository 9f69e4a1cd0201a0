"""The pure curriculum against the sequential oracle, plus its properties."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import ref_lanes, ref_stream, ref_swrr
from zephon_dask.curriculum import MixtureWorkSource, plan, worker_lanes
from zephon_dask.curriculum.mixture import Mixture, interleave
from zephon_dask.curriculum.order import DatasetOrder
from zephon_dask.curriculum.permutation import permutation, permute, permute_each
from zephon_dask.errors import (
    ChunkOutOfRangeError,
    ConfigError,
    DuplicateNameError,
    ElasticityWarning,
    EmptyDatasetError,
    EndlessStreamError,
    ZephonError,
)


class Sized:
    """The curriculum only needs a name and shard sizes."""

    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, tuple(sizes)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw):
    n = draw(st.integers(1, 3))
    datasets = []
    for i in range(n):
        sizes = draw(st.lists(st.integers(0, 25), min_size=1, max_size=4))
        assume(sum(sizes) > 0)
        datasets.append((f"d{i}", sizes))
    weights = draw(st.one_of(st.none(), st.lists(st.integers(1, 5), min_size=n, max_size=n)))
    raw = [sum(s) for _, s in datasets] if weights is None else weights
    ws = [Fraction(w, sum(raw)) for w in raw]
    min_cs = Mixture.min_chunk_size(ws)
    chunk_size = draw(st.integers(min_cs, max(min_cs, 24)))
    policy = draw(st.sampled_from([None, None, "stop", "repeat"]))
    kw = dict(
        weights=None if weights is None else {name: w for (name, _), w in zip(datasets, weights)},
        chunk_size=chunk_size,
        seed=draw(st.integers(0, 2**40)),
        shuffle_shards=draw(st.booleans()),
        shuffle_within_shard=draw(st.booleans()),
        shuffle_block_size=draw(st.one_of(st.none(), st.integers(1, 9))),
        reshuffle_on_repeat=draw(st.booleans()),
        lane_assignment=draw(st.sampled_from(["permute", "modulo"])),
    )
    if policy is None:
        kw["stop_after_passes"] = draw(st.integers(1, 3))
    else:
        kw["exhausted_policy"] = policy
        kw["max_repeats"] = draw(st.integers(1, 2)) if policy == "repeat" else None
    return datasets, kw


def _build(datasets, kw):
    try:
        return MixtureWorkSource([Sized(n, s) for n, s in datasets], **kw)
    except ConfigError as exc:
        assume("no chunk" not in str(exc))
        raise


def _reference(datasets, kw):
    weights = [sum(s) for _, s in datasets] if kw["weights"] is None else list(kw["weights"].values())
    return ref_stream(
        datasets, weights, kw["chunk_size"], kw["seed"], kw["shuffle_shards"],
        kw["shuffle_within_shard"], kw["shuffle_block_size"], kw.get("stop_after_passes", 1),
        kw.get("exhausted_policy"), kw.get("max_repeats"), kw["reshuffle_on_repeat"],
    )


@SETTINGS
@given(configs())
def test_direct_chunks_match_sequential_oracle(cfg):
    datasets, kw = cfg
    ws = _build(datasets, kw)
    truth = _reference(datasets, kw)
    assert len(ws) == len(truth)
    for g in range(len(ws)):
        assert [tuple(p) for p in ws.chunk(g)] == truth[g]


@SETTINGS
@given(configs())
def test_chunk_counts_are_the_chunks_datasets(cfg):
    datasets, kw = cfg
    ws = _build(datasets, kw)
    for g in range(min(len(ws), 40)):
        counts = ws.chunk_counts(g)
        assert counts.dtype == np.int64
        assert counts.tolist() == np.bincount(ws.chunk_arrays(g).dataset, minlength=len(ws.names)).tolist()


@SETTINGS
@given(configs(), st.integers(1, 6), st.integers(1, 4))
def test_lanes_and_windows_match_oracle(cfg, replicas, k):
    datasets, kw = cfg
    ws = _build(datasets, kw)
    lanes = ref_lanes(len(ws), replicas, kw["seed"], kw["lane_assignment"])
    union = []
    for lane in range(replicas):
        expected = [g for g, owner in enumerate(lanes) if owner == lane]
        chunks = ws.lane_chunks(lane, replicas)
        assert list(chunks) == expected
        assert len(chunks) == len(expected)
        assert [chunks[j] for j in range(len(expected))] == expected
        assert all(ws.lane_of(g, replicas) == lane for g in expected)
        windows = [ws.window(lane, w, replicas, k) for w in range(ws.num_windows(lane, replicas, k))]
        assert [g for win in windows for g in win] == expected
        assert all(len(win) == k for win in windows[:-1])
        union += expected
    assert sorted(union) == list(range(len(ws)))  # every chunk, exactly once


@SETTINGS
@given(configs(), st.integers(1, 8))
def test_each_block_gives_each_lane_one_chunk(cfg, replicas):
    datasets, kw = cfg
    ws = _build(datasets, kw)
    full_blocks = len(ws) // replicas
    for b in range(full_blocks):
        owners = [ws.lane_of(b * replicas + s, replicas) for s in range(replicas)]
        assert sorted(owners) == list(range(replicas))


@SETTINGS
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=5).filter(lambda s: sum(s) > 0),
    st.integers(0, 2**32), st.booleans(), st.booleans(), st.one_of(st.none(), st.integers(1, 13)),
    st.booleans(), st.integers(0, 3),
)
def test_each_pass_visits_every_sample_once(sizes, seed, shards, within, block, reshuffle, epoch):
    order = DatasetOrder("x", tuple(sizes), seed, shards, within, block, reshuffle)
    n = sum(sizes)
    shard, offset = order.locate(np.arange(epoch * n, (epoch + 1) * n))
    assert sorted(zip(shard.tolist(), offset.tolist())) == [
        (s, o) for s, size in enumerate(sizes) for o in range(size)
    ]
    if not reshuffle:  # every epoch repeats epoch 0
        s0, o0 = order.locate(np.arange(n))
        assert (s0 == shard).all() and (o0 == offset).all()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 1000), min_size=1, max_size=6),
    st.integers(1, 300), st.integers(0, 10**12),
)
def test_allocation_is_exact_and_monotone(raw, chunk_size, g):
    ws = [Fraction(w, sum(raw)) for w in raw]
    assume(chunk_size >= Mixture.min_chunk_size(ws))
    mix = Mixture(ws, chunk_size, [f"d{i}" for i in range(len(ws))])
    a, b = mix.allocated(g), mix.allocated(g + 1)
    assert sum(a) == g * chunk_size and sum(b) == (g + 1) * chunk_size
    assert all(y >= x for x, y in zip(a, b))
    # bounded deviation from the ideal share
    assert all(abs(a[c] - g * chunk_size * ws[c]) <= len(ws) for c in range(len(ws)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=5).filter(lambda c: sum(c) > 0))
def test_interleave_matches_reference_swrr(counts):
    seq = interleave(tuple(counts))
    assert seq.tolist() == ref_swrr(counts)
    assert Counter(seq.tolist()) == Counter({c: n for c, n in enumerate(counts) if n})


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.lists(st.integers(0, 2**64 - 1), min_size=8, max_size=8))
def test_permutation_is_a_bijection_with_inverse(n, keys):
    keys = tuple(keys)
    p = permutation(n, keys)
    assert sorted(p.tolist()) == list(range(n))
    assert (permute(p, n, keys, inverse=True) == np.arange(n)).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.lists(st.tuples(st.integers(0, 10**9), *[st.integers(0, 2**64 - 1)] * 8), max_size=12),
       st.booleans())
def test_permute_each_is_permute_under_each_elements_keys(n, rows, inverse):
    index = [i % n for i, *_ in rows]
    keys = np.array([k for _, *k in rows], dtype=np.uint64).reshape(len(rows), 8)
    expected = [int(permute([i], n, tuple(k), inverse=inverse)[0]) for i, *k in zip(index, *keys.T, strict=True)]
    assert permute_each(index, n, keys, inverse=inverse).tolist() == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.sampled_from(["contiguous", "interleaved"]))
def test_groups_partition_lanes(replicas, degree, mapping):
    assume(degree <= replicas)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElasticityWarning)
        p = plan(replicas, degree, mapping)
    lanes = [lane for group in p.groups for lane in group]
    assert sorted(lanes) == list(range(replicas))
    sizes = [len(g) for g in p.groups]
    assert max(sizes) - min(sizes) <= 1


def test_seed_examples():
    with pytest.warns(ElasticityWarning, match="not divisible"):
        assert plan(8, 3).groups == ((0, 1, 2), (3, 4, 5), (6, 7))
    with pytest.warns(ElasticityWarning):
        assert plan(8, 3, "interleaved").groups == ((0, 3, 6), (1, 4, 7), (2, 5))
    assert plan(8, 2).groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert plan(8, 4).groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan(8, 8).groups == tuple((i,) for i in range(8))


def test_lane_chunks_do_not_depend_on_topology():
    ws = MixtureWorkSource([Sized("a", [300, 200]), Sized("b", [100])], chunk_size=8, seed=5)
    per_lane = {lane: list(ws.lane_chunks(lane, 8)) for lane in range(8)}
    for degree in (1, 2, 4, 8):
        for mapping in ("contiguous", "interleaved"):
            for group in ws.group_lanes(8, degree, mapping):
                for lane in group:
                    assert list(ws.lane_chunks(lane, 8)) == per_lane[lane]


def test_worker_split():
    assert worker_lanes([0, 1, 2, 3], 2) == [[0, 2], [1, 3]]
    assert worker_lanes([0, 1, 2, 3], 3) == [[0, 2], [1, 3], []]
    assert worker_lanes([4, 5, 6], 2) == [[4, 5, 6], []]
    assert worker_lanes([4, 5, 6], 4) == [[4], [5], [6], []]
    assert worker_lanes([7], 0) == [[7]]
    # polling active workers in order replays strict round-robin over the lanes
    for lanes in ([0, 1, 2, 3, 4, 5], [3, 9], list(range(12))):
        for n in range(1, 8):
            split = [w for w in worker_lanes(lanes, n) if w]
            polled = [w[j] for j in range(len(split[0])) for w in split]
            assert polled == lanes


def test_seed_changes_order():
    a = MixtureWorkSource([Sized("a", [500, 500])], chunk_size=64, seed=1)
    b = MixtureWorkSource([Sized("a", [500, 500])], chunk_size=64, seed=2)
    assert a.chunk(0) != b.chunk(0)
    assert [a.lane_of(g, 4) for g in range(8)] != [b.lane_of(g, 4) for g in range(8)]


def test_same_order_in_fresh_process_with_other_hash_seed():
    code = (
        "import json;from zephon_dask.curriculum import MixtureWorkSource\n"
        "class S:\n def __init__(s,n,z): s.name=n; s.shard_sizes=z\n"
        "ws=MixtureWorkSource([S('web',[40,70]),S('code',[33])],{'web':3,'code':1},chunk_size=16,seed=11)\n"
        "print(json.dumps([[list(p) for p in ws.chunk(g)] for g in range(len(ws))]+"
        "[[ws.lane_of(g,4) for g in range(len(ws))]]))"
    )
    outs = []
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1]
    # ... and equal to this process
    ws = MixtureWorkSource([Sized("web", [40, 70]), Sized("code", [33])], {"web": 3, "code": 1}, chunk_size=16, seed=11)
    assert outs[0][0] == [list(p) for p in ws.chunk(0)]


def test_golden_order():
    """Pins the curriculum's bytes: a change here changes every user's data."""
    ws = MixtureWorkSource([Sized("web", [40, 70]), Sized("code", [33])], {"web": 3, "code": 1}, chunk_size=8, seed=7)
    assert [tuple(p) for p in ws.chunk(0)] == GOLDEN_CHUNK0
    assert [ws.lane_of(g, 4) for g in range(8)] == GOLDEN_LANES


GOLDEN_CHUNK0 = [
    ("web", 1, 25), ("web", 1, 11), ("code", 0, 27), ("web", 1, 27),
    ("web", 1, 33), ("web", 1, 41), ("code", 0, 13), ("web", 1, 69),
]
GOLDEN_LANES = [3, 0, 2, 1, 1, 3, 0, 2]


def test_curriculum_is_pure_in_fresh_interpreter():
    code = (
        "import sys, zephon_dask.curriculum\n"
        "bad=[m for m in ('dask','distributed','torch') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""


def test_endless_stream():
    ws = MixtureWorkSource([Sized("a", [10])], chunk_size=4, exhausted_policy="repeat")
    assert ws.num_chunks is None
    with pytest.raises(EndlessStreamError):
        len(ws)
    with pytest.raises(TypeError):  # also a TypeError, like len() of a generator
        len(ws.lane_chunks(0, 2))
    assert ws.lane_chunks(1, 2)[1000] > 0
    assert len(ws.chunk(10**9)) == 4
    assert ws.window(0, 5, 2, 3) == ws.lane_chunks(0, 2)[15:18]


def test_policy_lengths():
    one = MixtureWorkSource([Sized("a", [10]), Sized("b", [30])], chunk_size=4)
    assert len(one) == 10  # both datasets complete one pass after 40 samples
    stop = MixtureWorkSource([Sized("a", [10]), Sized("b", [30])], {"a": 1, "b": 1}, chunk_size=4, exhausted_policy="stop")
    assert len(stop) == 5  # a runs out after 10 samples at half the mixture
    two = MixtureWorkSource([Sized("a", [10]), Sized("b", [30])], {"a": 1, "b": 1}, chunk_size=4, stop_after_passes=2)
    assert len(two) == 30  # b needs 60 samples
    capped = MixtureWorkSource([Sized("a", [10]), Sized("b", [30])], {"a": 1, "b": 1}, chunk_size=4, exhausted_policy="repeat", max_repeats=1)
    assert len(capped) == 10


def test_big_stream_is_direct():
    big = MixtureWorkSource([Sized("a", [10**9] * 10), Sized("b", [10**8] * 3)], chunk_size=1000, seed=1)
    assert len(big) == 10_300_000
    last = big.chunk(len(big) - 1)
    assert len(last) == 1000
    lane = big.lane_chunks(3, 8)
    assert big.lane_of(lane[-1], 8) == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(weights={"a": -1, "b": 1}), "must be > 0"),
        (dict(weights={"a": float("nan"), "b": 1}), "finite"),
        (dict(weights={"a": float("inf"), "b": 1}), "finite"),
        (dict(weights={"a": 1, "c": 1}), "unknown \\['c'\\], missing \\['b'\\]"),
        (dict(weights={"a": "x", "b": 1}), "not a number"),
        (dict(weights=[1, 2]), "must be a dict"),
        (dict(chunk_size=0), "chunk_size=0"),
        (dict(seed=-1), "seed=-1"),
        (dict(lane_assignment="random"), "lane_assignment='random'"),
        (dict(exhausted_policy="loop"), "exhausted_policy='loop'"),
        (dict(exhausted_policy="stop", stop_after_passes=2), "set only one"),
        (dict(max_repeats=2), "needs exhausted_policy='repeat'"),
        (dict(shuffle_block_size=0), "shuffle_block_size=0"),
    ],
)
def test_bad_config_is_typed(kwargs, match):
    with pytest.raises(ConfigError, match=match) as info:
        MixtureWorkSource([Sized("a", [10]), Sized("b", [30])], **{"chunk_size": 4, **kwargs})
    assert isinstance(info.value, ValueError) and isinstance(info.value, ZephonError)


def test_chunk_size_too_small_names_smallest_valid():
    datasets = [Sized(f"d{i}", [100]) for i in range(5)]
    with pytest.raises(ConfigError, match="Use chunk_size >= 20"):
        MixtureWorkSource(datasets, {f"d{i}": 1 for i in range(5)}, chunk_size=3)
    MixtureWorkSource(datasets, {f"d{i}": 1 for i in range(5)}, chunk_size=20)


def test_dataset_errors():
    with pytest.raises(DuplicateNameError, match="'a'"):
        MixtureWorkSource([Sized("a", [3]), Sized("a", [4])])
    with pytest.raises(EmptyDatasetError, match="'e'"):
        MixtureWorkSource([Sized("e", [0, 0])])
    with pytest.raises(ConfigError, match="at least one"):
        MixtureWorkSource([])
    with pytest.raises(ConfigError, match="no chunk"):
        MixtureWorkSource([Sized("a", [3])], chunk_size=8, exhausted_policy="stop")


def test_degree_errors_and_ranges():
    ws = MixtureWorkSource([Sized("a", [100])], chunk_size=4)
    with pytest.raises(ConfigError, match="dp_degree=9 exceeds canonical_replicas=8"):
        ws.plan(8, 9)
    with pytest.raises(ConfigError, match="mapping_strategy='zigzag'"):
        ws.group_lanes(8, 2, "zigzag")
    with pytest.raises(ConfigError, match="canonical_replicas=0"):
        ws.lane_chunks(0, 0)
    with pytest.raises(ChunkOutOfRangeError):
        ws.chunk(25)
    with pytest.raises(IndexError):
        ws.lane_chunks(0, 4)[100]
    with pytest.raises(ChunkOutOfRangeError):
        ws.window(0, 99, 4, 2)
