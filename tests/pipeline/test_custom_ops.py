"""A user's operators (``add_op``) and batch functions (``map_batch``) over whole runs: the batches
of the built-in equivalent (``.map``, ``.shuffle``) computed by the oracle, resumed at any cut,
on another DP degree and microbatch, on either in-process runner and any DataLoader worker count."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.unit.test_add_op import MyShuffle, Upper, upper
from zephon_dask.pipeline.ranks import owned_lanes

SLOW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def pipeline(corpus_dir, custom, seed=5, R=4, k=2, microbatch=3, drop_last=True, **options):
    """``web`` and ``code``, upper-cased, tokenized, shuffled and packed: by ``add_op`` when
    ``custom``, else by ``.map`` and ``.shuffle``."""
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
    pipe = z.Pipeline(z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=12, seed=seed))
    pipe = pipe.add_op(Upper()) if custom else pipe.map(upper)
    pipe = pipe.tokenize()
    pipe = pipe.add_op(MyShuffle(16)) if custom else pipe.shuffle(16)
    return pipe.pack(96, algorithm="wrap").batch(microbatch, drop_last=drop_last).options(
        canonical_replicas=R, flush_every_k_chunks=k, **options)


@SLOW
@given(seed=st.integers(0, 3), R=st.sampled_from([2, 4]), k=st.integers(1, 3), microbatch=st.integers(1, 4),
       runner=st.sampled_from(["synchronous", "threads"]), group=st.integers(0, 1),
       cuts=st.lists(st.integers(0, 200), min_size=1, max_size=3))
def test_resumed_at_any_cut_equals_the_maps_oracle(corpus_dir, seed, R, k, microbatch, runner, group, cuts):
    opts = dict(seed=seed, R=R, k=k, microbatch=microbatch, runner=runner, dp_degree=2, dp_group_id=group)
    reference = pipeline(corpus_dir, False, **opts)
    truth = ref_group_stream(reference.spec, owned_lanes(reference.description.settings), microbatch)
    got, state = [], None
    for cut in sorted(cuts) + [None]:
        pipe = pipeline(corpus_dir, True, **opts)
        if state is not None:
            pipe.load_state_dict(json.loads(json.dumps(state)))
        with pipe:
            it = iter(pipe)
            while len(got) < min(len(truth) if cut is None else cut, len(truth)):
                got.append(batch_rows(next(it)))
            state = pipe.state_dict()
    assert got == truth


def steps(pipes, n, per_step):
    """Per global step, the multiset of delivered rows (tokens and lineage) over ``pipes``: ``n``
    steps, or (``None``) until every pipe ends."""
    iters = [iter(p) for p in pipes]
    out: list[Counter] = []
    while n is None or len(out) < n:
        step: Counter = Counter()
        for it in iters:
            for _ in range(per_step):
                batch = next(it, None)
                if batch is not None:
                    for i in range(batch.num_samples):
                        row = batch["tokens"][i][:batch["lengths"][i]]
                        step[(tuple(row.tolist()), tuple(map(tuple, batch.sources(i))))] += 1
        if n is None and not step:
            break
        out.append(step)
    return out


def group(corpus_dir, custom, dp, microbatch, mapping="contiguous"):
    return [pipeline(corpus_dir, custom, R=4, k=1, microbatch=microbatch, drop_last=False, runner="synchronous",
                     dp_degree=dp, dp_group_id=g, mapping_strategy=mapping,
                     batches_per_step=4 * (2 // microbatch) // dp, drop_last_step=False)  # to the stream's end
            for g in range(dp)]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 12), dp=st.sampled_from([1, 4]), microbatch=st.sampled_from([1, 2]),
       mapping=st.sampled_from(["contiguous", "interleaved"]))
def test_resumes_exactly_on_another_dp_degree(corpus_dir, cut, dp, microbatch, mapping):
    """Checkpoint a dp=2 ``add_op`` run at global step ``cut``; resume on ``dp`` (microbatch 2 ->
    ``microbatch``): every step equals the uninterrupted single-rank ``.map`` run's."""
    truth = steps(group(corpus_dir, False, 1, 2), None, 4)
    full = next(i for i, s in enumerate(truth) if sum(s.values()) < 8)  # steps where every lane has 2 rows
    before = group(corpus_dir, True, 2, 2)
    head = steps(before, cut, 2)
    state = z.merge_states([p.state_dict() for p in before])
    after = group(corpus_dir, True, dp, microbatch, mapping)
    for p in after:
        p.load_state_dict(state)
    tail = steps(after, None, 4 * (2 // microbatch) // dp)
    assert head == truth[:cut]
    assert tail[:max(full - cut, 0)] == truth[cut:full]
    assert sum(head + tail, Counter()) == sum(truth, Counter())  # nothing skipped or repeated


def test_dataloader_workers_resume_exactly(corpus_dir):
    """Two DataLoader workers, cut, resumed with none: the ``.map`` oracle's batches, each once."""
    reference = pipeline(corpus_dir, False, runner="threads")
    truth = ref_group_stream(reference.spec, owned_lanes(reference.description.settings), 3)
    pipe, got = pipeline(corpus_dir, True, runner="threads"), []
    for t in pipe.to_torch_loader(num_workers=2):
        got.append((int(t["lane"]), int(t["index_in_lane"]),
                    [row[:n].tolist() for row, n in zip(t["tokens"], t["lengths"], strict=True)]))
        if len(got) == 7:
            break
    state = pipe.state_dict()
    pipe.close()
    resumed = pipeline(corpus_dir, True, runner="threads").load_state_dict(state)
    with resumed:
        got += [batch_rows(b) for b in resumed]
    assert Counter(json.dumps(x) for x in got) == Counter(json.dumps(x) for x in truth)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 20), dp=st.sampled_from([1, 4]), microbatch=st.sampled_from([2, 3]))
def test_map_batch_resumes_as_the_function_of_each_batch(corpus_dir, cut, dp, microbatch):
    """``map_batch`` is a function of each lane batch: a dp=2 run checkpointed at global step ``cut``
    and resumed on another degree gives the oracle's batches, each through the function."""
    def shift(b):
        return {**b, "tokens": b["tokens"] * 2, "width": np.array([b["tokens"].shape[1]])}

    def pipes(degree):
        return [pipeline(corpus_dir, True, microbatch=microbatch, runner="synchronous", dp_degree=degree,
                         dp_group_id=g, drop_last_step=False).map_batch(shift, version=1) for g in range(degree)]

    plain = pipeline(corpus_dir, True, microbatch=microbatch, drop_last_step=False)  # to the stream's end
    truth = {(lane, i): [[2 * t for t in row] for row in rows]
             for lane, i, rows in ref_group_stream(plain.spec, list(range(4)), microbatch)}
    first = pipes(2)
    seen = {}
    for p in first:
        for b in itertools.islice(p, 2 * cut):  # two lanes per group: a step is two batches
            seen[(b.lane, b.index_in_lane)] = batch_rows(b)[2]
    state = z.merge_states([p.state_dict() for p in first])
    for p in pipes(dp):
        p.load_state_dict(state)
        with p:
            for b in p:
                assert (b.lane, b.index_in_lane) not in seen
                assert int(b["width"][0]) == b["tokens"].shape[1]
                seen[(b.lane, b.index_in_lane)] = batch_rows(b)[2]
    assert seen == truth
