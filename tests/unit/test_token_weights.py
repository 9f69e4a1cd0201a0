"""``weight_by="tokens"``: token shares measured once, allocated exactly, kept in checkpoints.

The oracle is ``ref_token_allocation`` (token weights over tokens per sample,
chunks walked one by one); the accuracy check is a full pass over a corpus whose
datasets differ tenfold in document length, read from real JSONL files. With a
mixture schedule, every phase's token shares are checked the same way, and a
resume across the phase boundary (also through torchdata's StatefulDataLoader) reuses the
checkpoint's numbers.
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_stream, ref_token_allocation
from zephon_dask.core import phases
from zephon_dask.curriculum import MixtureWorkSource
from zephon_dask.curriculum.mixture import Mixture
from zephon_dask.errors import ConfigError, StateError, ZephonWarning
from zephon_dask.inspect import phase_plan, plan_table
from zephon_dask.pipeline import measure, resume
from zephon_dask.state import State

WORDS = "a bb ccc dddd eeeee".split()


def write_docs(path, n, lo, hi, seed):
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))),
                                 "i": i}) + "\n")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """``short``: 1,500 documents of 4-16 words (more than one measured sample); ``long``: 150 of
    60-100 words (about ten times as many tokens per document)."""
    root = tmp_path_factory.mktemp("skewed")
    write_docs(root / "short" / "part-0.jsonl", 800, 4, 16, 1)
    write_docs(root / "short" / "part-1.jsonl", 700, 4, 16, 2)
    write_docs(root / "long" / "part-0.jsonl", 150, 60, 100, 3)
    return root


def datasets(root):
    return [z.Dataset.from_jsonl("short", str(root / "short"), progress=False),
            z.Dataset.from_jsonl("long", str(root / "long"), progress=False)]


def pipeline(root, weights=None, R=2, k=4, seed=0, weight_by="tokens", **options):
    source = z.MixtureWorkSource(datasets(root), weights or {"short": 0.3, "long": 0.7}, chunk_size=16,
                                 seed=seed, weight_by=weight_by)
    return (z.Pipeline(source).tokenize().pack(256).batch(2)
            .options(canonical_replicas=R, flush_every_k_chunks=k, runner="synchronous", **options))


# -- accuracy ---------------------------------------------------------------------------------


def test_full_pass_token_shares_are_within_two_points_of_the_target(skewed):
    pipe = pipeline(skewed)
    tps = dict(zip(pipe.spec.source.names, pipe.spec.source.tokens_per_sample))
    assert 8 < tps["long"] / tps["short"] < 12  # the corpus is skewed tenfold
    for _ in pipe:
        pass
    s = pipe.stats()
    assert s.weight_by == "tokens"
    for m, target in zip(s.mixture, (0.3, 0.7)):
        assert m["target"] == m["token_target"] == target
        assert m["realized"] == m["token_share"]
        assert abs(m["token_share"] - target) < 0.02, s
        assert abs(m["sample_share"] - m["sample_target"]) < 0.02, s
    assert "weighted by tokens" in str(s) and "token target" in str(s)
    # the same weights read as sample shares would give long documents ~95% of the tokens
    assert 0.7 * tps["long"] / (0.7 * tps["long"] + 0.3 * tps["short"]) > 0.9
    pipe.close()


# -- the measurement ----------------------------------------------------------------------------


def test_measurement_is_a_seeded_sample_through_the_record_operators(skewed):
    short, long = datasets(skewed)
    idx = measure.sample_indices(1500, 7, 0)
    rng = np.random.default_rng(np.random.SeedSequence([7, measure.TAG, 0]))
    assert idx.tolist() == sorted(rng.choice(1500, size=measure.SAMPLE_SIZE, replace=False).tolist())
    assert measure.sample_indices(150, 7, 1).tolist() == list(range(150))  # a small dataset: all of it

    # the reference: read the sampled records, tokenize them byte by byte (+ EOS)
    expected = {}
    for c, ds in enumerate((short, long)):
        flat = measure.sample_indices(ds.num_samples, 7, c)
        starts = np.cumsum([0, *ds.shard_sizes])
        tokens = 0
        for i in flat.tolist():
            shard = int(np.searchsorted(starts, i, side="right") - 1)
            (rec,) = ds.read(shard, np.array([i - starts[shard]]))
            tokens += len(rec["text"].encode()) + 1
        expected[ds.name] = Fraction(tokens, len(flat))
    source = z.MixtureWorkSource([short, long], {"short": 1, "long": 1}, chunk_size=16, seed=7,
                                 weight_by="tokens")
    pipe = z.Pipeline(source).tokenize()
    assert dict(zip(source.names, pipe.spec.source.tokens_per_sample)) == expected
    assert z.Pipeline(source).tokenize().spec.source.tokens_per_sample == pipe.spec.source.tokens_per_sample
    # the pipeline's own operators: a filter's dropped records count as zero tokens
    odd = z.Pipeline(source).filter(lambda r: r["i"] % 2 == 1, version=1).tokenize()
    assert all(a < b for a, b in zip(odd.spec.source.tokens_per_sample, pipe.spec.source.tokens_per_sample))
    assert source.unmeasured and pipe.spec.source is pipe.spec.source  # measured once, on a new source
    with pytest.raises(ConfigError, match="not measured"):
        len(source)
    with pytest.raises(ConfigError, match="positive number"):  # every record filtered out
        _ = z.Pipeline(source).filter(lambda r: False, version=1).tokenize().spec.source


def test_derived_pipelines_measure_with_their_own_operators(skewed):
    source = z.MixtureWorkSource(datasets(skewed), {"short": 1, "long": 1}, chunk_size=16, weight_by="tokens")
    base = z.Pipeline(source).tokenize(eos=False)
    first = base.spec.source.tokens_per_sample  # measured with tokenize only
    longer = base.map(lambda r: {**r, "tokens": list(r["tokens"]) * 2}, version=1)
    assert longer.spec.source.tokens_per_sample == tuple(2 * t for t in first)


# -- identity and checkpoints -------------------------------------------------------------------


def test_config_and_fingerprint_carry_weight_by_and_the_numbers(skewed):
    tokens, samples = pipeline(skewed), pipeline(skewed, weight_by="samples")
    cfg = tokens.spec.config()["source"]
    assert cfg["weight_by"] == "tokens" and cfg["weights"] == {"short": "3/10", "long": "7/10"}
    assert cfg["tokens_per_sample"] == {n: f"{v.numerator}/{v.denominator}" for n, v in
                                        zip(tokens.spec.source.names, tokens.spec.source.tokens_per_sample)}
    assert "weight_by" not in samples.spec.config()["source"]  # as before weight_by existed
    assert tokens.fingerprint() != samples.fingerprint()
    given = z.MixtureWorkSource(datasets(skewed), {"short": 0.3, "long": 0.7}, chunk_size=16, weight_by="tokens",
                                tokens_per_sample=cfg["tokens_per_sample"])
    same = z.Pipeline(given).tokenize().pack(256).batch(2).options(canonical_replicas=2, flush_every_k_chunks=4)
    assert same.fingerprint() == tokens.fingerprint()
    other = given.with_tokens_per_sample({"short": 10, "long": 100})
    assert z.Pipeline(other).tokenize().pack(256).batch(2).options(
        canonical_replicas=2, flush_every_k_chunks=4).fingerprint() != tokens.fingerprint()
    state = tokens.state_dict()
    assert state["config"]["source"]["tokens_per_sample"] == cfg["tokens_per_sample"]
    with pytest.raises(StateError, match="weight_by"):
        pipeline(skewed, weight_by="samples").load_state_dict(state)
    with pytest.raises(StateError, match="weight_by"):
        tokens.load_state_dict(samples.state_dict())


def take(pipe, n):
    out = []
    for batch in pipe:
        out.append(batch_rows(batch))
        if len(out) == n:
            break
    return out


def test_resume_reuses_the_checkpoint_measurement(skewed, monkeypatch):
    truth = take(pipeline(skewed), 30)
    first = pipeline(skewed)
    head = take(first, 12)
    state = z.load_state(z.save_state(skewed / "state.json", first.state_dict()))
    saved = first.spec.source.tokens_per_sample
    monkeypatch.setattr(measure, "SAMPLE_SIZE", 5)  # a measurement now gives other numbers...
    assert pipeline(skewed).spec.source.tokens_per_sample != saved
    resumed = pipeline(skewed)

    def never(*args):
        raise AssertionError("a resume must not measure")

    monkeypatch.setattr(measure, "measure_tokens_per_sample", never)  # ...and is never made
    resumed.load_state_dict(state)
    assert resumed.spec.source.tokens_per_sample == saved
    assert head + take(resumed, 18) == truth
    given = z.MixtureWorkSource(datasets(skewed), {"short": 0.3, "long": 0.7}, chunk_size=16, weight_by="tokens",
                                tokens_per_sample={"short": 1, "long": 2})
    explicit = (z.Pipeline(given).tokenize().pack(256).batch(2)
                .options(canonical_replicas=2, flush_every_k_chunks=4, runner="synchronous"))
    with pytest.warns(ZephonWarning, match="checkpoint's tokens_per_sample"):
        explicit.load_state_dict(state)
    assert take(explicit, 18) == truth[12:]


def test_elastic_resume_dp1_to_dp2_keeps_every_step(skewed):
    """R=4: checkpoint dp=1 after 3 global steps, resume on dp=2; every step's batches equal the
    uninterrupted run's."""
    def run(pipes, steps, per_rank):
        its = [iter(p) for p in pipes]
        return [Counter(tuple(map(tuple, batch_rows(next(it))[2])) for it in its for _ in range(per_rank))
                for _ in range(steps)]

    truth = run([pipeline(skewed, R=4, k=2, batches_per_step=4)], 8, 4)
    one = pipeline(skewed, R=4, k=2, batches_per_step=4)
    head = run([one], 3, 4)
    state = one.state_dict()
    two = [pipeline(skewed, R=4, k=2, dp_degree=2, dp_group_id=g, batches_per_step=2).load_state_dict(state)
           for g in range(2)]
    assert head + run(two, 5, 2) == truth


# -- with a mixture schedule --------------------------------------------------------------------


def scheduled(root, schedule, R=2, k=4, pack=False, microbatch=8, **options):
    source = z.MixtureWorkSource(datasets(root), schedule=schedule, chunk_size=16, seed=0, weight_by="tokens",
                                 exhausted_policy="stop")
    pipe = z.Pipeline(source).tokenize()
    if pack:
        pipe = pipe.pack(256)
    return pipe.batch(microbatch).options(canonical_replicas=R, flush_every_k_chunks=k, runner="synchronous",
                                          **options)


def test_each_schedule_phase_meets_its_token_shares_over_a_pass(skewed):
    """Phase 0 asks 30% of the tokens from short documents, phase 1 (from step 30) 70%; both are
    converted with the same measured tokens per sample. Rows are samples here, so each phase's
    steps are exact and its realized token shares are compared with its own targets."""
    pipe = scheduled(skewed, [(0, {"short": 0.3, "long": 0.7}), (30, {"short": 0.7, "long": 0.3})])
    source = pipe.spec.source
    tps = source.tokens_per_sample
    assert source.phase_chunks == (0, 30) and 8 < tps[1] / tps[0] < 12  # 30 steps x 16 samples = 30 chunks
    for p, phase in enumerate(source.phases):
        mass = [w / s for w, s in zip(phase.weights, tps)]
        assert source.phase_weights[p] == tuple(m / sum(mass) for m in mass)  # t_c / s_c, normalised
        assert source.phase_source(p).weights == source.phase_weights[p]  # what step resolution measures under
    for _ in pipe:
        pass
    s = pipe.stats()
    first, second = s.phases
    assert (first["to_step"], second["from_step"]) == (30, 30) and first["samples"] == 30 * 16
    assert second["samples"] > 800  # both phases long enough for a 2-point check
    for ph in (first, second):
        assert ph["realized"] == ph["token_share"] and ph["target"] == ph["token_target"]
        for name in source.names:
            assert abs(ph["token_share"][name] - ph["token_target"][name]) < 0.02, s
            assert abs(ph["sample_share"][name] - ph["sample_target"][name]) < 0.01, s
    overall = {m["dataset"]: m for m in s.mixture}  # token targets blended by the tokens of each phase
    blend = (0.3 * first["tokens"] + 0.7 * second["tokens"]) / (first["tokens"] + second["tokens"])
    assert overall["short"]["token_target"] == pytest.approx(blend)
    assert abs(overall["short"]["token_share"] - blend) < 0.02
    text = str(s)
    assert "mixture by schedule phase, weighted by tokens" in text and "token target" in text
    assert "(of tokens)" in str(pipe.explain()) and "the first schedule phase" in str(plan_table(pipe, (1, 2)))
    pipe.close()


def test_resume_across_the_phase_boundary_reuses_the_measurement(skewed, monkeypatch):
    """R=4, packed rows (so steps become chunks through a measured rows-per-sample): checkpoint
    dp=1 after 3 global steps, before phase 1 begins; resume on dp=2 across the boundary without
    measuring anything again. Every step's batches equal the uninterrupted run's."""
    schedule = [(0, {"short": 0.3, "long": 0.7}), (6, {"short": 0.8, "long": 0.2})]

    def make(**options):
        return scheduled(skewed, schedule, R=4, k=2, pack=True, microbatch=2, **options)

    def run(pipes, steps, per_rank):
        its = [iter(p) for p in pipes]
        return [Counter(tuple(map(tuple, batch_rows(next(it))[2])) for it in its for _ in range(per_rank))
                for _ in range(steps)]

    whole = make(batches_per_step=4)
    begin = phase_plan(whole)[1].begin_step
    assert 3 < begin < 10
    truth = run([whole], 10, 4)
    one = make(batches_per_step=4)
    head = run([one], 3, 4)
    state = z.load_state(z.save_state(skewed / "sched-state.json", one.state_dict()))
    saved = state["config"]["source"]
    assert saved["tokens_per_sample"] and [ph["chunk"] for ph in saved["schedule"]] == list(
        whole.spec.source.phase_chunks)
    assert resume.frontier(State.from_dict(state), 2) <= whole.spec.source.phase_chunks[1] // 4  # phase 1 not started yet

    def never(*args):
        raise AssertionError("a resume must not measure")

    monkeypatch.setattr(measure, "measure_tokens_per_sample", never)
    monkeypatch.setattr(phases, "rows_per_sample", never)  # the phase starts come from the checkpoint too
    two = [make(dp_degree=2, dp_group_id=g, batches_per_step=2).load_state_dict(state) for g in range(2)]
    assert all(p.spec.source.tokens_per_sample == whole.spec.source.tokens_per_sample for p in two)
    assert head + run(two, 7, 2) == truth
    merged = z.merge_states([p.state_dict() for p in two])
    assert resume.frontier(State.from_dict(merged), 2) > whole.spec.source.phase_chunks[1] // 4  # the dp 2 leg crossed
    assert merged["fingerprint"] == whole.fingerprint()


def test_stateful_dataloader_resumes_a_token_schedule_across_its_boundary(skewed, monkeypatch):
    """Through torchdata's StatefulDataLoader (2 batches a step, phase 1 from step 4: item 8):
    checkpoint just before, at and just after the boundary, restore into a fresh loader over a
    fresh pipeline; the resumed items equal the uninterrupted run's byte for byte. A fresh
    measurement now gives other numbers (and other batches), yet loading the state and the whole
    resumed run measure nothing: the checkpoint's tokens per sample win. (Building the fresh loader
    measures once, before any state is known: ``to_torch_dataset()`` measures eagerly.)"""
    torch = pytest.importorskip("torch")
    loader_class = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    schedule = [(0, {"short": 0.3, "long": 0.7}), (4, {"short": 0.8, "long": 0.2})]
    total, cuts = 20, (7, 8, 9)

    def fresh():
        pipe = scheduled(skewed, schedule)
        return pipe, loader_class(pipe.to_torch_dataset(), batch_size=None)

    def items(loader, n):
        out = []
        for item in loader:
            out.append(tuple((key, str(t.dtype), tuple(t.shape), t.numpy().tobytes())
                             for key, t in sorted(item.items())))
            if len(out) == n:
                break
        return out

    whole, loader = fresh()
    truth = items(loader, total)
    saved = whole.spec.source.tokens_per_sample
    assert whole.spec.source.phase_chunks == (0, 4) and phase_plan(whole)[1].begin_step == 4
    assert whole.session.step_shape().global_batches == 2  # phase 1 begins at item 4 x 2 = 8
    heads, states = {}, {}
    for k in cuts:
        _, first = fresh()
        heads[k] = items(first, k)
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)  # how frameworks store it
        states[k] = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)

    monkeypatch.setattr(measure, "SAMPLE_SIZE", 5)  # a measurement now gives other numbers...
    drifted, loader = fresh()
    assert drifted.spec.source.tokens_per_sample != saved
    drift = items(loader, total)

    def never(*args):
        raise AssertionError("a resume must not measure")

    for k in cuts:
        pipe, resumed = fresh()
        with monkeypatch.context() as m:
            m.setattr(measure, "measure_tokens_per_sample", never)  # ...and none is made on resume
            resumed.load_state_dict(states[k])
            tail = items(resumed, total - k)
            assert pipe.spec.source.tokens_per_sample == saved
        assert heads[k] + tail == truth, f"cut at item {k}"
        assert drift[k:] != truth[k:]  # a resume on the fresh numbers would have been caught


def loader_items(loader, n, cuts=()):
    """The first ``n`` items of ``loader`` as bytes, and its state after each of the first ``cut``
    items (a JSON round trip: the state is plain builtins)."""
    out, states = [], {}
    for item in loader:
        out.append(tuple((key, str(t.dtype), tuple(t.shape), t.numpy().tobytes())
                         for key, t in sorted(item.items())))
        if len(out) in cuts:
            states[len(out)] = json.loads(json.dumps(loader.state_dict()))
        if len(out) == n:
            break
    return out, states


def dataset_steps(state):
    """The ``step`` of every PipelineDataset state nested in a StatefulDataLoader state."""
    if isinstance(state, dict):
        if state.get("format") == "zephon_dask.dataset_state":
            return [state["state"]["step"]] if state["state"] else []
        return [s for v in state.values() for s in dataset_steps(v)]
    return []


@pytest.mark.parametrize("workers, per_step", [(0, 2), (0, 4), (2, 2), (2, 4)])
def test_stateful_dataloader_state_records_the_global_step_of_a_schedule(skewed, workers, per_step):
    """2 lanes; ``batches_per_step`` 2 or 4; no DataLoader workers (2 lanes each step) or 2
    workers (1 lane each). The loader's state records the group's step (G batches of the
    microbatch), not the lanes a worker serves, so a fresh loader over a fresh pipeline with the
    same settings accepts it and continues the uninterrupted items byte for byte, from cuts
    mid-step, just before, at and just after the phase boundary (step 2)."""
    loader_class = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    schedule = [(0, {"short": 0.3, "long": 0.7}), (2, {"short": 0.8, "long": 0.2})]
    boundary = 2 * per_step  # items before phase 1
    cuts, total = (1, boundary - 1, boundary, boundary + 1), boundary + 4

    def fresh():
        pipe = scheduled(skewed, schedule, batches_per_step=per_step)
        return pipe, loader_class(pipe.to_torch_dataset(), batch_size=None, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    whole, loader = fresh()
    plan = phase_plan(whole)
    assert plan[1].exact and plan[1].begin_step == 2 and whole.session.step_shape().global_batches == per_step
    truth, states = loader_items(loader, total, cuts)
    del loader
    steps = dataset_steps(states[boundary])
    assert len(steps) == max(workers, 1)
    assert all(s["global_batches"] == per_step and s["microbatch_size"] == 8 and s["dp_degree"] == 1
               and (s["global_step"], s["batches_in_step"]) == (2, 0) for s in steps), steps
    for k in cuts:
        _, resumed = fresh()
        resumed.load_state_dict(states[k])
        assert truth[:k] + loader_items(resumed, total - k)[0] == truth, f"cut at item {k}"


def test_stateful_dataloader_resume_keeps_the_global_step_of_its_state(skewed):
    """A loader state taken with 4 batches a step resumes a pipeline that leaves the step unset
    (it would default to 2): the state's G wins, so the phase keeps its chunk and the items go on
    as before; a pipeline that asks for another G is refused with the diff, as a pipeline's own
    state is."""
    loader_class = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    schedule = [(0, {"short": 0.3, "long": 0.7}), (2, {"short": 0.8, "long": 0.2})]

    def fresh(**options):
        pipe = scheduled(skewed, schedule, **options)
        return pipe, loader_class(pipe.to_torch_dataset(), batch_size=None)

    _, loader = fresh(batches_per_step=4)
    truth, states = loader_items(loader, 12, (7,))
    pipe, resumed = fresh()
    assert pipe.session.step_shape().global_batches == 2
    resumed.load_state_dict(states[7])
    tail, after = loader_items(resumed, 5, (5,))
    assert truth[:7] + tail == truth
    assert [(s["global_step"], s["batches_in_step"], s["global_batches"]) for s in dataset_steps(after[5])] == [(3, 0, 4)]
    _, refused = fresh(batches_per_step=2)
    refused.load_state_dict(states[7])
    with pytest.raises(StateError, match="step.global_batches: checkpoint 4, pipeline 2"):
        next(iter(refused))


# -- the pure conversion against the oracle ---------------------------------------------------


class Sized:
    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, tuple(sizes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(1, 5000), st.integers(1, 40)), min_size=1, max_size=4),
    st.integers(1, 64), st.integers(0, 10**9), st.integers(0, 2**32),
)
def test_token_weights_allocate_like_the_oracle(parts, chunk_size, g, seed):
    names = [f"d{i}" for i in range(len(parts))]
    weights = {n: w for n, (w, _, _) in zip(names, parts)}
    tps = {n: Fraction(t, d) for n, (_, t, d) in zip(names, parts)}
    shares = [Fraction(w) / tps[n] for n, w in weights.items()]
    assume(chunk_size >= Mixture.min_chunk_size([x / sum(shares) for x in shares]))
    sizes = [[5, 7]] * len(parts)
    source = MixtureWorkSource([Sized(n, s) for n, s in zip(names, sizes)], weights, chunk_size=chunk_size,
                               seed=seed, weight_by="tokens", tokens_per_sample=tps, exhausted_policy="repeat")
    small = g % 50  # the oracle walks the chunks; the fast path answers directly
    assert list(source.allocation(small).values()) == ref_token_allocation(small, chunk_size, list(weights.values()),
                                                                          list(tps.values()))
    # the sample weights give exactly the token shares asked for, and the allocation stays close
    w = source.weights
    token_mass = [w[c] * tps[n] for c, n in enumerate(names)]
    assert [m / sum(token_mass) for m in token_mass] == [Fraction(x, sum(weights.values())) for x in weights.values()]
    alloc = list(source.allocation(g).values())
    assert all(abs(alloc[c] - g * chunk_size * w[c]) <= len(parts) for c in range(len(parts)))
    # chunk contents: the stream of the converted weights
    chunks = ref_stream([(n, s) for n, s in zip(names, sizes)], list(w), chunk_size, seed, max_chunks=3,
                        policy="repeat")
    assert [[tuple(p) for p in source.chunk(j)] for j in range(3)] == chunks


def test_a_token_schedule_is_the_sample_schedule_of_its_converted_weights():
    data = [Sized("a", [40, 30]), Sized("b", [50])]
    tps = {"a": 3, "b": Fraction(25, 2)}
    stated = [(0, {"a": 1, "b": 1}), (4, {"a": 1, "b": 0}), (8, {"a": 1, "b": 3})]
    kw = {"schedule_unit": "chunk", "chunk_size": 8, "seed": 3, "exhausted_policy": "repeat"}
    token = MixtureWorkSource(data, schedule=stated, weight_by="tokens", tokens_per_sample=tps, **kw)
    converted = [(g, dict(zip(token.names, w))) for (g, _), w in zip(stated, token.phase_weights)]
    samples = MixtureWorkSource(data, schedule=converted, **kw)
    assert token.phase_weights[0] == (Fraction(25, 31), Fraction(6, 31)) and token.weights == token.phase_weights[0]
    assert all(token.chunk(g) == samples.chunk(g) for g in range(16))
    assert token.target_weights == (Fraction(1, 2), Fraction(1, 2))  # as stated, like the config
    assert token.config()["schedule"][2]["weights"] == {"a": "1/4", "b": "3/4"}
    unmeasured = MixtureWorkSource(data, schedule=stated, weight_by="tokens", **kw)
    assert "tokens per sample not measured, 3 phases" in repr(unmeasured)
    with pytest.raises(ConfigError, match="not measured"):
        unmeasured.chunk(0)
    assert unmeasured.with_tokens_per_sample(tps).config() == token.config()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"weight_by": "bytes"}, "weight_by='bytes' is unknown"),
    ({"tokens_per_sample": {"a": 1, "b": 1}}, "only used with weight_by='tokens'"),
    ({"weight_by": "tokens", "tokens_per_sample": {"a": 1, "c": 1}}, r"unknown \['c'\]"),
    ({"weight_by": "tokens", "tokens_per_sample": {"a": 1, "b": 0}}, "'b' is 0"),
    ({"weight_by": "tokens", "tokens_per_sample": {"a": 1, "b": "x"}}, "positive number"),
    ({"weight_by": "tokens", "tokens_per_sample": [1, 2]}, "must be a number for every dataset or a dict"),
])
def test_bad_token_weights_are_typed(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MixtureWorkSource([Sized("a", [10]), Sized("b", [10])], {"a": 1, "b": 1}, chunk_size=4, **kwargs)
    with pytest.raises(ConfigError, match="weight_by='tokens'"):
        MixtureWorkSource([Sized("a", [10])], chunk_size=4).with_tokens_per_sample({"a": 1})


def test_recipe_weight_by_tokens_builds_the_hand_built_pipeline(skewed, tmp_path, capsys):
    from zephon_dask.cli import main as cli

    path = tmp_path / "recipe.toml"
    path.write_text(f"""
[[datasets]]
name = "short"
path = "{skewed / 'short'}"
weight = 0.3

[[datasets]]
name = "long"
path = "{skewed / 'long'}"
weight = 0.7

[source]
chunk_size = 16
weight_by = "tokens"

[tokenize]
tokenizer = "bytes"

[pack]
max_length = 256

[batch]
microbatch_size = 2

[options]
canonical_replicas = 2
flush_every_k_chunks = 4
""")
    built = z.Pipeline.from_config(path)
    assert built.fingerprint() == pipeline(skewed).fingerprint()
    assert cli(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tokens/sample" in out and "weight_by" in out and "3/10 (30.0%)" in out
    assert "weighted by tokens" in str(plan_table(built, (1, 2)))


def test_a_pipeline_that_does_not_tokenize_yet_shows_and_refuses_clearly(skewed):
    source = z.MixtureWorkSource(datasets(skewed), {"short": 1, "long": 3}, chunk_size=16, weight_by="tokens")
    bare = z.Pipeline(source).options(runner="synchronous")
    assert "not yet" in repr(bare) and "0.75 of tokens" in repr(bare)  # a repr neither reads nor raises
    with pytest.raises(ConfigError, match=r"call \.tokenize"):
        iter(bare)
    assert "tokens/sample" in repr(bare.tokenize())


# -- given, pinned and measured by a function -------------------------------------------------


def estimated(root, **source):
    ws = z.MixtureWorkSource(datasets(root), {"short": 0.3, "long": 0.7}, chunk_size=16, weight_by="tokens",
                             **source)
    return (z.Pipeline(ws).tokenize().pack(256).batch(2)
            .options(canonical_replicas=2, flush_every_k_chunks=4, runner="synchronous"))


def test_one_number_is_every_datasets_tokens_per_sample():
    data = [Sized("a", [10]), Sized("b", [10])]
    one = MixtureWorkSource(data, {"a": 1, "b": 3}, chunk_size=8, weight_by="tokens", tokens_per_sample=812.5)
    named = MixtureWorkSource(data, {"a": 1, "b": 3}, chunk_size=8, weight_by="tokens",
                              tokens_per_sample={"a": "1625/2", "b": 812.5})
    assert not one.unmeasured and one.tokens_per_sample == (Fraction(1625, 2),) * 2
    assert one.config() == named.config()  # the same numbers, the same fingerprint
    assert one.weights == (Fraction(1, 4), Fraction(3, 4))  # equal tokens per sample: token shares


def test_pins_are_merged_over_the_measured_values(skewed, monkeypatch):
    asked = []
    real = measure.measure_tokens_per_sample

    def spy(source, ops, names=None):
        asked.append(names)
        return real(source, ops, names)

    monkeypatch.setattr(measure, "measure_tokens_per_sample", spy)
    full = estimated(skewed).spec.source
    pinned = estimated(skewed, tokens_per_sample={"long": 99}).spec.source
    assert asked == [("short", "long"), ("short",)]  # only the unpinned
    assert pinned.tokens_per_sample == (full.tokens_per_sample[0], Fraction(99))
    assert pinned.config()["tokens_per_sample"] == {"short": pinned.config()["tokens_per_sample"]["short"],
                                                    "long": "99/1"}


def test_a_measure_function_replaces_the_sampled_measurement_and_is_not_called_on_resume(skewed, tmp_path):
    calls = []

    def by_name(dataset):
        calls.append(dataset.name)
        return {"short": 10, "long": 100.5}[dataset.name]

    first = estimated(skewed, tokens_per_sample={"short": 12}, measure=by_name)
    truth = take(estimated(skewed, tokens_per_sample={"short": 12, "long": 100.5}), 20)
    head = take(first, 8)
    assert calls == ["long"]  # once, for the unpinned dataset
    assert first.spec.source.tokens_per_sample == (Fraction(12), Fraction(201, 2))
    text = str(first.explain())
    assert "given: short; measure=" in text and "by_name: long" in text
    state = z.load_state(z.save_state(tmp_path / "state.json", first.state_dict()))
    resumed = estimated(skewed, tokens_per_sample={"short": 12}, measure=by_name)
    resumed.load_state_dict(state)
    assert head + take(resumed, 12) == truth
    assert calls == ["long"]  # the state holds the values: a resume never measures again
    other = estimated(skewed, tokens_per_sample={"short": 13}, measure=by_name)
    with pytest.warns(ZephonWarning, match="checkpoint's tokens_per_sample"):
        other.load_state_dict(state)  # a pin the checkpoint contradicts: the checkpoint's value, said
    assert other.spec.source.tokens_per_sample == (Fraction(12), Fraction(201, 2)) and calls == ["long"]


@pytest.mark.parametrize(("fn", "match"), [
    (lambda d: "many", "returned 'many' for dataset 'short'"),
    (lambda d: 0, "'short' is 0"),
    (lambda d: 1 / 0, None),
])
def test_a_bad_measure_function_is_named(skewed, fn, match):
    pipe = estimated(skewed, measure=fn)
    if match is None:
        with pytest.raises(ZeroDivisionError) as info:
            pipe.spec  # noqa: B018
        assert any("measure=" in note and "'short'" in note for note in info.value.__notes__)
    else:
        with pytest.raises(ConfigError, match=match):
            pipe.spec  # noqa: B018
    with pytest.raises(ConfigError, match="must be a function"):
        MixtureWorkSource(datasets(skewed), chunk_size=16, weight_by="tokens", measure=3)
