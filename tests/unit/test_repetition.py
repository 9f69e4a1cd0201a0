"""Per-dataset repetition and the read order inside a chunk, against the sequential oracle."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.helpers.oracles import ref_schedule_stream, ref_stream
from zephon_dask.core.spec import sha256_json
from zephon_dask.curriculum import MixtureWorkSource
from zephon_dask.curriculum.mixture import Mixture
from zephon_dask.errors import ConfigError

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Sized:
    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, tuple(sizes)


@st.composite
def per_dataset(draw):
    """Datasets with a dict ``exhausted_policy`` (at least one dataset limits the stream)."""
    n = draw(st.integers(2, 3))
    datasets = [(f"d{i}", draw(st.lists(st.integers(1, 30), min_size=1, max_size=3))) for i in range(n)]
    weights = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    ws = [Fraction(w, sum(weights)) for w in weights]
    min_cs = Mixture.min_chunk_size(ws)
    names = [name for name, _ in datasets]
    policy = {name: draw(st.sampled_from(["stop", "repeat"])) for name in names}
    repeating = [name for name in names if policy[name] == "repeat"]
    repeats = {name: draw(st.one_of(st.none(), st.integers(1, 3))) for name in repeating}
    assume(any(policy[n] == "stop" or repeats.get(n) is not None for n in names))  # the stream ends
    kw = dict(
        weights=dict(zip(names, weights)),
        chunk_size=draw(st.integers(min_cs, max(min_cs, 16))),
        seed=draw(st.integers(0, 2**40)),
        shuffle_block_size=draw(st.one_of(st.none(), st.integers(1, 7))),
        exhausted_policy=policy,
        max_repeats=draw(st.sampled_from([repeats, {n: k for n, k in repeats.items() if k is not None}])),
        reshuffle_on_repeat={name: draw(st.booleans()) for name in draw(st.sets(st.sampled_from(names)))},
    )
    return datasets, kw


def _build(datasets, kw):
    try:
        return MixtureWorkSource([Sized(n, s) for n, s in datasets], **kw)
    except ConfigError as exc:
        assume("no chunk" not in str(exc) and "inside one chunk" not in str(exc))
        raise


@SETTINGS
@given(per_dataset())
def test_per_dataset_policies_match_the_sequential_oracle(cfg):
    datasets, kw = cfg
    ws = _build(datasets, kw)
    truth = ref_stream(datasets, list(kw["weights"].values()), kw["chunk_size"], kw["seed"], True, True,
                       kw["shuffle_block_size"], 1, kw["exhausted_policy"], kw["max_repeats"],
                       kw["reshuffle_on_repeat"])
    assert len(ws) == len(truth)  # the binary search over the allocation == walking chunk by chunk
    for g in range(len(ws)):
        assert [tuple(p) for p in ws.chunk(g)] == truth[g]


def test_a_small_set_repeated_beside_a_crawl_read_once():
    web, curated = Sized("web", [400, 600]), Sized("curated", [50])
    ws = MixtureWorkSource([web, curated], {"web": 4, "curated": 1}, chunk_size=50,
                           exhausted_policy={"web": "stop", "curated": "repeat"}, max_repeats={"curated": 3})
    # web (40 a chunk) ends it after 25 chunks; curated (10 a chunk) takes 250 = 5 passes, past its 4
    # allowed: it ends at 20 chunks instead
    assert len(ws) == 20 and ws.allocation(20) == {"web": 800, "curated": 200}
    unbounded = MixtureWorkSource([web, curated], {"web": 4, "curated": 1}, chunk_size=50,
                                  exhausted_policy={"web": "stop", "curated": "repeat"})
    assert len(unbounded) == 25 and unbounded.allocation(25)["curated"] == 250
    assert ws.config()["exhausted_policy"] == {"web": "stop", "curated": "repeat"}
    assert ws.config()["max_repeats"] == 3  # over the repeating datasets, one value
    endless = MixtureWorkSource([web, curated], chunk_size=50,
                                exhausted_policy={"web": "repeat", "curated": "repeat"},
                                max_repeats={"web": 1})
    truth = ref_stream([("web", [400, 600]), ("curated", [50])], [1000, 50], 50, 0, policy=endless.exhausted_policy,
                       max_repeats={"web": 1})
    assert endless.num_chunks == len(truth) == 42  # web's 2,000 samples end it


def test_equal_values_by_name_are_the_one_value():
    a, b = Sized("a", [30]), Sized("b", [50])
    one = MixtureWorkSource([a, b], chunk_size=8, exhausted_policy="repeat", max_repeats=2,
                            reshuffle_on_repeat=False)
    named = MixtureWorkSource([a, b], chunk_size=8, exhausted_policy={"a": "repeat", "b": "repeat"},
                              max_repeats={"a": 2, "b": 2}, reshuffle_on_repeat={"a": False, "b": False})
    assert named.config() == one.config() and sha256_json(named.config()) == sha256_json(one.config())
    assert one.config()["exhausted_policy"] == "repeat" and one.config()["max_repeats"] == 2
    assert len(named) == len(one)


def test_reshuffle_by_name_changes_only_that_dataset():
    a, b = Sized("a", [6]), Sized("b", [6])
    kw = dict(chunk_size=4, exhausted_policy="repeat", max_repeats=3, seed=3)
    both = MixtureWorkSource([a, b], **kw)
    frozen = MixtureWorkSource([a, b], **kw, reshuffle_on_repeat={"b": False})
    assert frozen.orders[0] == both.orders[0]
    b_pass = [frozen.orders[1].locate(range(e * 6, e * 6 + 6))[1].tolist() for e in range(3)]
    assert b_pass[0] == b_pass[1] == b_pass[2]


@pytest.mark.parametrize("kw, match", [
    (dict(exhausted_policy={"a": "stop"}), r"missing \['b'\]"),
    (dict(exhausted_policy={"a": "stop", "b": "again"}), "'again'"),
    (dict(exhausted_policy={"a": "stop", "b": "stop", "c": "stop"}), r"unknown \['c'\]"),
    (dict(exhausted_policy={"a": "stop", "b": "repeat"}, max_repeats={"a": 1}), r"names \['a'\]"),
    (dict(exhausted_policy={"a": "stop", "b": "repeat"}, max_repeats={"b": 0}), r"max_repeats\['b'\]"),
    (dict(exhausted_policy="stop", max_repeats=2), "needs exhausted_policy='repeat'"),
    (dict(exhausted_policy={"a": "stop", "b": "repeat"}, stop_after_passes=2), "set only one"),
    (dict(reshuffle_on_repeat={"a": "no"}), r"reshuffle_on_repeat\['a'\]"),
    (dict(exhausted_policy={"a": "stop", "b": "repeat"}, weights={"a": 1, "b": 1}, chunk_size=100),
     "'b' repeats .* 40 samples, fewer than its 50"),
])
def test_bad_per_dataset_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        MixtureWorkSource([Sized("a", [900]), Sized("b", [40])], **{"chunk_size": 8, **kw})


def test_a_schedule_that_never_reaches_an_end_is_refused_naming_the_datasets():
    a, b = Sized("a", [100]), Sized("b", [100])
    schedule = [(0, {"a": 1, "b": 1}), (4, {"b": 1})]
    with pytest.raises(ConfigError, match=r"never end: \['a'\]"):
        MixtureWorkSource([a, b], chunk_size=10, schedule=schedule, schedule_unit="chunk",
                          exhausted_policy={"a": "stop", "b": "repeat"})
    ends = MixtureWorkSource([a, b], chunk_size=10, schedule=schedule, schedule_unit="chunk",
                             exhausted_policy={"a": "repeat", "b": "stop"})
    assert len(ends) == 12  # b: 20 in the first 4 chunks, then 10 a chunk up to its 100


# -- read order ---------------------------------------------------------------------------


@st.composite
def mixtures(draw):
    n = draw(st.integers(1, 3))
    datasets = [(f"d{i}", draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))) for i in range(n)]
    weights = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    min_cs = Mixture.min_chunk_size([Fraction(w, sum(weights)) for w in weights])
    kw = dict(weights={name: w for (name, _), w in zip(datasets, weights)},
              chunk_size=draw(st.integers(min_cs, max(min_cs, 20))), seed=draw(st.integers(0, 2**40)),
              stop_after_passes=draw(st.integers(1, 2)))
    return [Sized(name, sizes) for name, sizes in datasets], kw


@SETTINGS
@given(mixtures(), st.sampled_from(["weighted_round_robin", "weighted_random"]),
       st.sampled_from(["as_is", "shuffle"]))
def test_read_order_moves_records_only_inside_their_chunk(mix, read_order, within):
    datasets, kw = mix
    base = MixtureWorkSource(datasets, **kw)
    ws = MixtureWorkSource(datasets, **kw, read_order=read_order, within_dataset=within)
    again = MixtureWorkSource(datasets, **kw, read_order=read_order, within_dataset=within)
    assert len(ws) == len(base)
    for g in range(len(ws)):
        got, rr = ws.chunk(g), base.chunk(g)
        assert got == again.chunk(g)  # a pure function of the seed and the chunk
        assert Counter(got) == Counter(rr)  # the same records
        assert ws.chunk_counts(g).tolist() == base.chunk_counts(g).tolist()
        if within == "as_is":  # each dataset's records in its own order
            for name in ws.names:
                assert [p for p in got if p.dataset == name] == [p for p in rr if p.dataset == name]
        if read_order == "weighted_round_robin":
            assert [p.dataset for p in got] == [p.dataset for p in rr]


def test_weighted_random_differs_from_round_robin_and_by_seed():
    datasets = [Sized("a", [500]), Sized("b", [500])]
    rr = MixtureWorkSource(datasets, chunk_size=32, seed=1)
    rnd = MixtureWorkSource(datasets, chunk_size=32, seed=1, read_order="weighted_random")
    other = MixtureWorkSource(datasets, chunk_size=32, seed=2, read_order="weighted_random")
    assert [p.dataset for p in rr.chunk(0)] == ["a", "b"] * 16
    assert [p.dataset for p in rnd.chunk(0)] != [p.dataset for p in rr.chunk(0)]
    assert [p.dataset for p in rnd.chunk(0)] != [p.dataset for p in rnd.chunk(1)]
    assert rnd.chunk(0) != other.chunk(0)
    shuffled = MixtureWorkSource(datasets, chunk_size=32, seed=1, within_dataset="shuffle")
    assert [p.dataset for p in shuffled.chunk(0)] == [p.dataset for p in rr.chunk(0)]
    assert shuffled.chunk(0) != rr.chunk(0)


def test_read_order_enters_the_config_only_when_set():
    datasets = [Sized("a", [50])]
    plain = MixtureWorkSource(datasets, chunk_size=8).config()
    assert "read_order" not in plain and "within_dataset" not in plain  # older fingerprints unchanged
    cfg = MixtureWorkSource(datasets, chunk_size=8, read_order="weighted_random", within_dataset="shuffle").config()
    assert cfg["read_order"] == "weighted_random" and cfg["within_dataset"] == "shuffle"
    with pytest.raises(ConfigError, match="read_order='random'"):
        MixtureWorkSource(datasets, chunk_size=8, read_order="random")
    with pytest.raises(ConfigError, match="within_dataset"):
        MixtureWorkSource(datasets, chunk_size=8, within_dataset="sorted")


def test_a_dataset_chunk_arrays_are_one_pass_locations():
    ws = MixtureWorkSource([Sized("a", [7, 9])], chunk_size=16, read_order="weighted_random",
                           within_dataset="shuffle", seed=4)
    arrays = ws.chunk_arrays(0)
    assert sorted(zip(arrays.shard.tolist(), arrays.offset.tolist(), strict=True)) == sorted(
        [(0, i) for i in range(7)] + [(1, i) for i in range(9)])
    assert np.all(arrays.dataset == 0)


@st.composite
def scheduled(draw):
    """Per-dataset policies under a two-phase chunk schedule."""
    datasets, kw = draw(per_dataset())
    names = [name for name, _ in datasets]
    second = [draw(st.integers(0, 4)) for _ in names]
    assume(any(second))
    first = list(kw.pop("weights").values())
    need = max(Mixture.min_chunk_size([Fraction(w, sum(ws)) for w in ws if w]) for ws in (first, second))
    kw["chunk_size"] = max(kw["chunk_size"], need)
    start = draw(st.integers(1, 6))
    return datasets, [(0, first), (start, second)], kw


@SETTINGS
@given(scheduled())
def test_per_dataset_policies_under_a_schedule_match_the_oracle(cfg):
    datasets, phase_list, kw = cfg
    names = [name for name, _ in datasets]
    schedule = [(g, {n: w for n, w in zip(names, ws) if w}) for g, ws in phase_list]
    try:
        ws = MixtureWorkSource([Sized(n, s) for n, s in datasets], schedule=schedule, schedule_unit="chunk", **kw)
    except ConfigError as exc:
        assume(not any(s in str(exc) for s in ("no chunk", "inside one chunk", "never", "never be reached")))
        raise
    truth = ref_schedule_stream(datasets, phase_list, kw["chunk_size"], kw["seed"], 1, kw["exhausted_policy"],
                                kw["max_repeats"], max_chunks=5_000, block=kw["shuffle_block_size"],
                                reshuffle=kw["reshuffle_on_repeat"])
    assert len(truth) < 5_000 and len(ws) == len(truth)
    for g in range(len(truth)):
        assert [tuple(p) for p in ws.chunk(g)] == truth[g]


def test_explain_lines_say_how_far_each_dataset_is_read():
    rep = MixtureWorkSource([Sized("a", [30]), Sized("b", [50])], chunk_size=8, stop_after_passes=2,
                            reshuffle_on_repeat={"b": False}).repetition
    assert rep.describe() == [("a", "passes as stop_after_passes needs, each pass reshuffled"),
                              ("b", "passes as stop_after_passes needs, every pass in the first one's order")]
    rep = MixtureWorkSource([Sized("a", [30]), Sized("b", [50])], chunk_size=8, max_repeats={"b": 2},
                            exhausted_policy={"a": "stop", "b": "repeat"}).repetition
    assert rep.describe() == [("a", "one pass, then the stream stops"),
                              ("b", "1 + 2 pass(es), then the stream stops, each pass reshuffled")]
