"""Per-dataset repetition and a random read order: resumes at any cut, on another dp degree,
equal the uninterrupted single-rank run, step by step."""

from __future__ import annotations

import warnings
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from zephon_dask.errors import ZephonWarning

SLOW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
R = 8  # canonical replicas
PER_DATASET = dict(exhausted_policy={"web": "stop", "code": "repeat"}, max_repeats={"code": 1},
                   reshuffle_on_repeat={"code": False})
STEPS = 24  # past the end of the stream (137 batches over 8 lanes)
FULL_STEPS = 9  # steps at which every lane still has a batch


def pipes(corpus_dir, dp, read_order="weighted_random", drop_last_step=False, **source):
    """Every sample to the stream's end by default (``drop_last_step=False``): the lanes end far apart,
    and these runs resume across the end on other degrees."""
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
    # code (100 samples, 9 a chunk) may be read twice: it ends the stream at chunk 22, before web's
    # one pass (180 samples, 3 a chunk) would
    ws = z.MixtureWorkSource([web, code], {"web": 1, "code": 3}, chunk_size=12, seed=11, read_order=read_order,
                             **{"within_dataset": "shuffle", **PER_DATASET, **source})
    return [z.Pipeline(ws).tokenize().pack(384).batch(1).options(
        canonical_replicas=R, flush_every_k_chunks=1, runner="synchronous", dp_degree=dp, dp_group_id=g,
        batches_per_step=R // dp, drop_last_step=drop_last_step) for g in range(dp)]


def samples(batch):
    return [tuple(map(tuple, batch.sources(i))) for i in range(batch.num_samples)]


def run(groups, steps, per_step):
    iters = [iter(p) for p in groups]
    out = []
    for _ in range(steps):
        step: Counter = Counter()
        for it in iters:
            for _ in range(per_step):
                batch = next(it, None)
                if batch is not None:
                    step.update(samples(batch))
        out.append(step)
    return out


def test_the_stream_ends_where_the_repeating_dataset_runs_out(corpus_dir):
    (one,) = pipes(corpus_dir, 1)
    assert len(one.spec.source) == 22
    assert one.spec.source.allocation(22) == {"web": 66, "code": 198}
    lanes = Counter(b.lane for b in one)
    assert min(lanes.values()) == FULL_STEPS
    assert one.num_steps() == sum(lanes.values()) // R == 17  # exact, from the per-dataset stream's end
    (whole,) = pipes(corpus_dir, 1, drop_last_step=True)  # the pass ends on the last step every lane completes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # 65 batches dropped: said
        assert whole.num_steps() == FULL_STEPS and sum(1 for _ in whole) == FULL_STEPS * R


@SLOW
@given(cut=st.integers(1, FULL_STEPS - 1), before=st.sampled_from([1, 2]), after=st.sampled_from([1, 2, 4, 8]))
def test_resume_on_another_dp_degree_equals_the_uninterrupted_run(corpus_dir, cut, before, after):
    (truth_pipe,) = pipes(corpus_dir, 1)
    truth = run([truth_pipe], STEPS, R)
    head_pipes = pipes(corpus_dir, before)
    head = run(head_pipes, cut, R // before)
    assert head == truth[:cut]
    state = z.merge_states([p.state_dict() for p in head_pipes])
    tail_pipes = pipes(corpus_dir, after)
    for p in tail_pipes:
        p.load_state_dict(state)
    tail = run(tail_pipes, STEPS * R, R // after)  # to each lane's end, however the degree groups them
    # while every lane still has a batch, each global step is the same; after, the lanes' last
    # batches are grouped by the degree, as in any elastic resume: the same samples in all
    assert (head + tail)[:FULL_STEPS] == truth[:FULL_STEPS]
    assert sum(head + tail, Counter()) == sum(truth, Counter())


def test_the_random_read_order_changes_the_batches(corpus_dir):
    (rnd,) = pipes(corpus_dir, 1)
    (rr,) = pipes(corpus_dir, 1, "weighted_round_robin")
    a, b = run([rnd], STEPS, R), run([rr], STEPS, R)
    assert a != b  # the same records (tests/unit/test_repetition.py), packed in another order


@SLOW
@given(cut=st.integers(1, FULL_STEPS * R - 1), after=st.sampled_from([1, 2, 4, 8]))
@example(cut=68, after=8).via("a group whose one lane gave its last batch must not start the next pass")
@example(cut=71, after=8).via("a group whose one lane gave its last batch must not start the next pass")
def test_a_mid_step_cut_loses_and_repeats_nothing(corpus_dir, cut, after):
    (truth_pipe,) = pipes(corpus_dir, 1)
    truth = sum(run([truth_pipe], STEPS, R), Counter())
    (head_pipe,) = pipes(corpus_dir, 1)
    it = iter(head_pipe)
    head: Counter = Counter()
    for _ in range(cut):
        head.update(samples(next(it)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # "n batches into a step": said, and expected here
        state = head_pipe.state_dict()
    tail_pipes = pipes(corpus_dir, after)
    for p in tail_pipes:
        p.load_state_dict(state)
    assert head + sum(run(tail_pipes, STEPS * R, R // after), Counter()) == truth


def test_a_cut_in_the_last_whole_step_resumed_lane_by_lane_ends_with_that_pass(corpus_dir):
    """A pass ending on whole steps, cut in its last one: the groups whose lane gave its batch of
    that step have none left, but the pass goes on in the others; they start the next pass with
    the next iteration, as the uninterrupted run's groups do, never at once."""
    def one_to_one(dp, g=0):
        web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
        code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
        ws = z.MixtureWorkSource([web, code], {"web": 1, "code": 1}, chunk_size=12, seed=3)
        return z.Pipeline(ws).tokenize().batch(2).options(
            canonical_replicas=R, flush_every_k_chunks=1, runner="synchronous", dp_degree=dp,
            dp_group_id=g, batches_per_step=R // dp)

    def drawn(batches):
        return Counter(s for b in batches for s in samples(b))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # the pass's end and the mid-step state: said
        whole = one_to_one(1)
        truth = list(whole)
        next_pass = drawn(whole)
        steps = whole.num_steps()
        assert len(truth) == steps * R
        head_pipe = one_to_one(1)
        it = iter(head_pipe)
        head = [next(it) for _ in range((steps - 1) * R + R // 2)]  # half of the last step
        state = head_pipe.state_dict()
        groups = [one_to_one(R, g) for g in range(R)]
        for p in groups:
            p.load_state_dict(state)
        tail = [list(p) for p in groups]
        assert [len(t) for t in tail] == [0] * (R // 2) + [1] * (R // 2)
        assert drawn(head) + drawn(b for t in tail for b in t) == drawn(truth)
        assert sum((drawn(p) for p in groups), Counter()) == next_pass  # then each its next pass
