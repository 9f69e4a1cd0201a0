"""A chunk size left open (``chunk_size=None``) is chosen from the data so every lane gets a chunk."""

from __future__ import annotations

import warnings
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_allocation, ref_group_stream
from zephon_dask.curriculum.chunking import choose_chunk_size, fitted
from zephon_dask.curriculum.mixture import Mixture
from zephon_dask.errors import ConfigError, ElasticityWarning, EmptyStreamError, StateError


class Sized:
    """The curriculum only needs a name and shard sizes."""

    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, tuple(sizes)


def notes(n=700, name="notes"):
    return z.Dataset.from_records(name, [{"text": f"note {i} " + "word " * (20 + i % 30)} for i in range(n)])


def small(n=700, **source):
    return (z.Pipeline(z.MixtureWorkSource([notes(n)], **source)).tokenize().pack(128).batch(4)
            .options(runner="synchronous"))


def test_700_documents_with_the_defaults_give_every_lane_batches():
    pipe = small()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElasticityWarning)  # no lane is left empty
        with pipe:
            lanes = {b.lane for b in pipe}
    assert lanes == set(range(8))
    assert pipe.spec.source.chunk_size == 64  # 700 samples: 11 chunks of 64, 1 of 1,024
    user = pipe.session.built_source  # the user's source is unchanged, and says it is open
    assert user.chunk_size == 1024 and user.auto_chunk_size and "chunk_size=auto" in repr(user)


def test_explain_says_the_chunk_size_was_chosen_and_how_to_fix_it():
    text = str(small().explain())
    assert "64 (chosen from the data: 700 samples, 8 lanes; set chunk_size= to fix it)" in text
    assert "chosen from the data" not in str(small(chunk_size=64).explain())


def test_a_given_chunk_size_is_never_changed_and_still_warns():
    pipe = small(chunk_size=1024)
    assert pipe.spec.source.chunk_size == 1024
    (note,) = [w for w in pipe.explain().warnings if "lanes get no chunk" in w]
    assert "chunk_size=64" in note and "leave chunk_size out" in note


def test_the_chosen_stream_is_the_stream_of_that_chunk_size_given():
    auto, given_ = small(), small(chunk_size=64)
    assert auto.spec.config() == given_.spec.config()
    assert auto.fingerprint() == given_.fingerprint()
    with auto, given_:
        assert [batch_rows(b) for b in auto] == [batch_rows(b) for b in given_]


def test_a_large_corpus_keeps_1024_and_its_fingerprint():
    ds = [Sized("big", [5000, 4000]), Sized("small", [300])]
    source = z.MixtureWorkSource(ds, {"big": 3, "small": 1})
    assert fitted(source, 8) is source and choose_chunk_size(source, 8) == 1024
    assert source.config() == z.MixtureWorkSource(ds, {"big": 3, "small": 1}, chunk_size=1024).config()
    big = notes(9000, "big")
    open_, given_ = (z.Pipeline(z.MixtureWorkSource([big], **kw)).tokenize() for kw in ({}, {"chunk_size": 1024}))
    assert open_.fingerprint() == given_.fingerprint()


def test_a_stream_with_no_chunk_of_1024_gets_a_smaller_one():
    with pytest.raises(ConfigError, match="no chunk"):
        small(exhausted_policy="stop", chunk_size=1024).spec  # noqa: B018
    assert small(exhausted_policy="stop").spec.source.chunk_size == 64
    three = [Sized("a", [1]), Sized("b", [500]), Sized("c", [500])]  # even 6 a chunk (2 each) is too many
    with pytest.raises(ConfigError, match="no chunk"):
        z.Pipeline(z.MixtureWorkSource(three, {"a": 1, "b": 1, "c": 1}, exhausted_policy="stop")).spec  # noqa: B018


def test_a_schedule_keeps_1024():
    source = z.MixtureWorkSource([Sized("a", [300]), Sized("b", [400])],
                                 schedule=[(0, {"a": 1, "b": 1}), (10, {"a": 1, "b": 3})])  # in steps
    assert not source.chooses_chunk_size and fitted(source, 8) is source


def test_a_recipe_without_chunk_size_leaves_it_open(tmp_path):
    (tmp_path / "notes.jsonl").write_text("".join(f'{{"text": "note {i} words"}}\n' for i in range(300)))
    (tmp_path / "recipe.toml").write_text('[[datasets]]\nname = "notes"\npath = "notes.jsonl"\n\n'
                                          "[tokenize]\n\n[pack]\nmax_length = 16\n")
    pipe = z.Pipeline.from_config(tmp_path / "recipe.toml")
    assert pipe.session.built_source.chooses_chunk_size and pipe.spec.source.chunk_size == 32


# -- the rule, against a walk of the stream ---------------------------------------------------

def ref_num_chunks(totals, weights, chunk_size, passes, policy, max_repeats):
    """Chunks in the stream, walked from chunk 0 (``None``: endless)."""
    if policy == "repeat" and max_repeats is None:
        return None
    limit = 1 if policy == "stop" else (1 + max_repeats if policy == "repeat" else None)
    g = 0
    while True:
        have = ref_allocation(g, chunk_size, weights)
        if policy is None and all(have[c] >= passes * totals[c] for c in range(len(totals))):
            return g
        if limit is not None and any(a > limit * t for a, t in zip(ref_allocation(g + 1, chunk_size, weights),
                                                                   totals)):
            return g
        g += 1


@st.composite
def corpora(draw):
    n = draw(st.integers(1, 3))
    sizes = [draw(st.lists(st.integers(1, 700), min_size=1, max_size=3)) for _ in range(n)]
    weights = draw(st.one_of(st.none(), st.lists(st.integers(1, 9), min_size=n, max_size=n)))
    policy = draw(st.sampled_from([None, None, "stop", "repeat"]))
    kw = {"weights": None if weights is None else {f"d{i}": w for i, w in enumerate(weights)}}
    if policy is None:
        kw["stop_after_passes"] = draw(st.integers(1, 3))
    else:
        kw["exhausted_policy"] = policy
        kw["max_repeats"] = draw(st.one_of(st.none(), st.integers(1, 2))) if policy == "repeat" else None
    return [Sized(f"d{i}", s) for i, s in enumerate(sizes)], kw, draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora())
def test_the_chosen_size_is_the_largest_power_of_two_that_gives_every_lane_a_chunk(corpus):
    datasets, kw, replicas = corpus
    try:
        source = z.MixtureWorkSource(datasets, **kw)
    except ConfigError:  # a mixture even 1,024 cannot keep monotone: nothing to choose
        return
    totals = list(source.sizes)
    weights = [Fraction(w) for w in source.weights]
    args = (kw.get("stop_after_passes", 1), kw.get("exhausted_policy"), kw.get("max_repeats"))
    floor = Mixture.min_chunk_size(weights)
    valid = [c for c in (1 << i for i in range(11)) if c >= floor]
    count = {c: ref_num_chunks(totals, weights, c, *args) for c in valid}
    chosen = choose_chunk_size(source, replicas)
    assert chosen in valid and chosen & (chosen - 1) == 0 and chosen <= 1024
    enough = [c for c in valid if count[c] is None or count[c] >= replicas]
    if enough:
        assert chosen == max(enough)
    else:  # no size gives every lane a chunk: the one giving the most
        assert count[chosen] == max(count.values())
    if count[chosen] == 0:
        with pytest.raises(ConfigError, match="no chunk"):
            fitted(source, replicas)
    else:
        assert fitted(source, replicas).num_chunks == count[chosen]
        assert fitted(source, replicas).chunk_size == chosen


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(9, 400), st.sampled_from([2, 4, 8]), st.integers(1, 3))
@example(9, 4, 1).via("too few records for a whole step: the error, from both")
@example(21, 8, 1).via("a lane short of the first step, found after the first batch")
def test_a_pipeline_with_the_size_chosen_equals_one_given_that_size(n, replicas, passes):
    def pipe(**kw):
        ds = z.Dataset.from_records("r", [{"text": f"record {i} " + "x" * (i % 17)} for i in range(n)])
        return (z.Pipeline(z.MixtureWorkSource([ds], stop_after_passes=passes, **kw)).tokenize().pack(24)
                .batch(2).options(runner="synchronous", canonical_replicas=replicas, flush_every_k_chunks=2))
    auto = pipe()
    given_ = pipe(chunk_size=auto.spec.source.chunk_size)
    assert auto.fingerprint() == given_.fingerprint()
    expected = ref_group_stream(given_.spec, list(range(replicas)), 2)
    with auto, given_, warnings.catch_warnings():
        warnings.simplefilter("ignore", ElasticityWarning)
        if not expected:  # a lane without a whole step: every batch would be dropped, said where it shows
            for pipe_ in (auto, given_):
                with pytest.raises(EmptyStreamError, match="no whole global step"):
                    list(pipe_)
            return
        delivered = [batch_rows(b) for b in auto]
        assert delivered == [batch_rows(b) for b in given_]
        assert delivered == expected


# -- resume --------------------------------------------------------------------------------

def test_a_chosen_size_resumes_exactly_on_another_dp_degree():
    truth = [batch_rows(b) for b in small()]
    before = [small().options(dp_degree=2, dp_group_id=g) for g in range(2)]
    head = []
    for p in before:
        it = iter(p)
        head += [batch_rows(next(it)) for _ in range(8)]  # two whole steps of 4 lanes
    state = z.merge_states([p.state_dict() for p in before])
    assert state["config"]["source"]["chunk_size"] == 64
    tail = []
    for g in range(4):
        after = small().options(dp_degree=4, dp_group_id=g).load_state_dict(state)
        assert after.spec.source.chunk_size == 64
        tail += [batch_rows(b) for b in after]
    key = lambda rows: (rows[0], rows[1])  # noqa: E731
    assert sorted(head + tail, key=key) == sorted(truth, key=key)


def test_a_resume_reuses_the_checkpoints_chunk_size_and_refuses_other_data():
    every = {"drop_last_step": False}  # lanes without a chunk: no whole global step to end a pass on
    written = small(chunk_size=1024).options(**every)  # a checkpoint from a run at 1,024 (the default before)
    it = iter(written)
    with pytest.warns(ElasticityWarning, match="7 lanes get no chunk"):
        [next(it) for _ in range(3)]
    state = written.state_dict()
    resumed = small().options(**every).load_state_dict(state)
    assert resumed.spec.source.chunk_size == 1024
    assert "the checkpoint's" in str(resumed.explain())
    with pytest.raises(StateError, match="different data configuration"):
        small(800).options(**every).load_state_dict(state)
    with pytest.raises(EmptyStreamError, match="no whole global step"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ElasticityWarning)
        next(iter(small(chunk_size=1024)))


def test_fewer_samples_than_lanes_get_the_most_chunks_and_a_note_to_lower_the_lanes():
    five = z.Pipeline(z.MixtureWorkSource([notes(5)])).tokenize().pack(8).batch(1)
    assert five.spec.source.chunk_size == 1 and five.spec.source.num_chunks == 5
    (note,) = [w for w in five.explain().warnings if "lanes get no chunk" in w]
    assert "lower canonical_replicas to 5 or less (with chunk_size=1)" in note


def test_token_weights_are_measured_before_the_size_is_chosen():
    short = z.Dataset.from_records("short", [{"text": f"s{i}"} for i in range(40)])
    long = z.Dataset.from_records("long", [{"text": f"long {i} " + "x" * 200} for i in range(40)])

    def pipe(**kw):
        return z.Pipeline(z.MixtureWorkSource([short, long], {"short": 1, "long": 1}, weight_by="tokens",
                                              **kw)).tokenize()
    auto = pipe()
    size = auto.spec.source.chunk_size
    assert size < 1024 and auto.spec.source.num_chunks >= 8 > auto.spec.source.with_chunk_size(2 * size).num_chunks
    assert auto.spec.config() == pipe(chunk_size=size).spec.config()
    assert size > 8  # by samples (80 of them) it would be 8: the measured weights decide
