"""ensure_mixture over whole runs: the delivered share, and resumes anywhere on any topology
against the uninterrupted single-rank run."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from zephon_dask.errors import ZephonWarning

R, STEP = 4, 8  # lanes, batches in a global step (two round-robin cycles)


def records(name, n):
    return {"s0": [{"text": f"{name} {i} " + "xy" * (i % 9), "i": i} for i in range(n)]}


def pipes(dp=1, strict=True, microbatch=2, weights=None, runner="synchronous", **kw):
    """Two datasets mixed 50/50; a filter keeps one record of ``b`` in four."""
    a = z.Dataset.from_records("a", records("a", 240))
    b = z.Dataset.from_records("b", records("b", 240))
    ws = z.MixtureWorkSource([a, b], {"a": 1, "b": 1}, chunk_size=12, seed=11)
    base = z.Pipeline(ws).filter(lambda r: r["text"].startswith("a") or r["i"] % 4 == 0).tokenize()
    if strict is not None:
        base = base.ensure_mixture(weights, strict=strict, **kw)
    # every sample (drop_last_step=False): groups in one process cannot vote on a pass's end, and the
    # whole runs compared here end the stream on every degree
    return [base.batch(microbatch, drop_last=False).options(canonical_replicas=R, flush_every_k_chunks=1, runner=runner,
                                           dp_degree=dp, dp_group_id=g, drop_last_step=False,
                                           global_batches_per_step=STEP * 2 // microbatch)
            for g in range(dp)]


def names(batch):
    return [tuple(map(tuple, batch.sources(i))) for i in range(batch.num_samples)]


def share_of_b(samples) -> float:
    counts = Counter(s[0][0] for s in samples)
    return counts["b"] / sum(counts.values())


def whole_run(ps):
    out = []
    for p in ps:
        with p:
            out += [s for batch in p for s in names(batch)]
    return out


def test_strict_delivers_the_target_share_after_a_filter_and_stats_show_it():
    drifted = whole_run(pipes(strict=None))
    assert share_of_b(drifted) == pytest.approx(0.2, abs=0.03)  # the filter's drift, silently
    (p,) = pipes(strict=True)
    with p:
        delivered = [s for batch in p for s in names(batch)]
        stats = p.stats()
    assert abs(share_of_b(delivered) - 0.5) <= 0.05
    rows = {m["dataset"]: m for m in stats.ensure_mixture}
    assert rows["a"]["target"] == rows["b"]["target"] == 0.5
    assert rows["a"]["dropped"] > 0 and rows["b"]["dropped"] == 0
    assert abs(rows["b"]["delivered_share"] - 0.5) <= 0.05
    assert "ensure_mixture" in str(stats) and "dropped samples" in stats._repr_html_()
    text = str(p.explain())
    assert "surplus         dropped (strict)" in text and "the source's mixture" in text
    # non-strict keeps every sample the filter left, only reordering them
    assert Counter(whole_run(pipes(strict=False))) == Counter(drifted)


def test_warn_tolerance_warns_once_per_iteration():
    (p,) = pipes(strict=False, warn_tolerance=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        whole_run([p])
    drift = [w for w in caught if "warn_tolerance=0.05" in str(w.message)]
    assert len(drift) == 1 and "ensure_mixture(strict=True)" in str(drift[0].message)
    (p,) = pipes(strict=True, warn_tolerance=0.1)  # strict holds each window within one sample
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZephonWarning)
        whole_run([p])


def run_steps(iters, steps, per_rank):
    """``steps`` global steps over the groups' iterators; per step the multiset of samples."""
    out = []
    for _ in range(steps):
        step: Counter = Counter()
        for it in iters:
            for _ in range(per_rank):
                batch = next(it, None)
                if batch is not None:
                    step.update(names(batch))
        out.append(step)
    return out


TRUTH: dict = {}


def truth(strict, weights):
    """The uninterrupted single-rank run's steps, and how many come before the first lane ends
    (after it, a group whose lanes ended delivers less: the steps are the same only before)."""
    key = (strict, tuple(sorted((weights or {}).items())))
    if key not in TRUTH:
        (p,) = pipes(1, strict, 2, weights)
        lanes: Counter = Counter()
        steps = []
        it = iter(p)
        for _ in range(100):
            step: Counter = Counter()
            for batch in filter(None, (next(it, None) for _ in range(STEP))):
                step.update(names(batch))
                lanes[batch.lane] += 1
            steps.append(step)
        p.close()
        assert not steps[-1], "the stream is longer than the steps run"
        TRUTH[key] = steps[:max(i for i, step in enumerate(steps) if step) + 1], min(lanes.values()) // (STEP // R)
    return TRUTH[key]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.sampled_from([1, 2, 4]), after=st.sampled_from([1, 2, 4]), cut=st.integers(1, 24),
       mid=st.integers(0, 3), strict=st.booleans(), weights=st.sampled_from([None, {"a": 1, "b": 2}]),
       microbatch=st.sampled_from([2, 1]), runner=st.sampled_from(["synchronous", "threads"]))
def test_resumes_anywhere_on_any_topology_equal_the_uninterrupted_run(before, after, cut, mid, strict, weights,
                                                                      microbatch, runner):
    """Cut after ``cut`` steps (and ``mid`` batches more per group: mid-step), resume on another
    dp degree, microbatch size and runner: step-aligned, every step equals the uninterrupted
    single-rank run's; mid-step, the whole run delivers the same samples."""
    expected, full = truth(strict, weights)
    # a cut (and the batches after it) before any lane ends: a group whose lanes all ended starts
    # its next pass on resume, as its uninterrupted iteration would after ending
    assert full >= 3
    cut = 1 + cut % (full - 2)
    mid %= STEP // before  # within the step
    head_pipes = pipes(before, strict, 2, weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # the mid-step warnings, tested in test_state
        iters = [iter(p) for p in head_pipes]
        head = run_steps(iters, cut, STEP // before)
        extra: Counter = Counter()
        for it in iters:
            for _ in range(mid):
                extra.update(names(next(it)))
        state = z.merge_states([p.state_dict() for p in head_pipes])
        tail_pipes = pipes(after, strict, microbatch, weights, runner=runner)
        for p in tail_pipes:
            p.load_state_dict(state)
        tail = run_steps([iter(p) for p in tail_pipes], 100, STEP * 2 // microbatch // after)  # to its end
    for p in head_pipes + tail_pipes:
        p.close()
    assert head == expected[:cut]
    if not mid and microbatch == 2:
        assert tail[:full - cut] == expected[cut:full]
    delivered = sum(head, Counter()) + extra + sum(tail, Counter())
    assert delivered == sum(expected, Counter())
    if strict and weights is None:  # the filter's 80/20 stays 50/50 across the resume
        assert abs(share_of_b(list(delivered.elements())) - 0.5) <= 0.05
