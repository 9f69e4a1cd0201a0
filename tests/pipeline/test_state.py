"""Checkpoints: fixed-topology resumes are exact, elastic resumes keep every global step.

The truth is always the oracle: ``ref_group_stream`` (windows computed one by
one with ``compute_window``, cut into batches, strict round-robin), or an
uninterrupted single-group run compared against it elsewhere.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.helpers.pipelines import build
from zephon_dask import compute_window
from zephon_dask.cli import main as cli
from zephon_dask.errors import ConfigError, StateError, ZephonWarning
from zephon_dask.inspect import state_html
from zephon_dask.pipeline.ranks import owned_lanes
from zephon_dask.state import schema

SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def take(pipeline, n):
    """The first ``n`` batches of a fresh iteration, as ``(lane, index_in_lane, rows)``."""
    out = []
    for batch in pipeline:
        out.append(batch_rows(batch))
        if len(out) == n:
            break
    return out


def samples(batch):
    """A delivered batch's samples, each named by its lineage (unique per packed row)."""
    return [tuple(map(tuple, batch.sources(i))) for i in range(batch.num_samples)]


def builtins_only(obj) -> bool:
    """Only plain dict/list/str/int/bool/float/None, as torch.load(weights_only=True) and JSON take."""
    if type(obj) is dict:
        return all(type(k) is str and builtins_only(v) for k, v in obj.items())
    if type(obj) is list:
        return all(builtins_only(v) for v in obj)
    return type(obj) in (str, int, bool, float, type(None))


def via_file(tmp_path, state, name="state.json"):
    return z.load_state(z.save_state(tmp_path / name, state))


# -- fixed topology: prefix + suffix == uninterrupted ------------------------------------


@SLOW
@given(
    seed=st.integers(0, 3),
    R=st.sampled_from([2, 4]),
    k=st.integers(1, 3),
    microbatch=st.integers(1, 5),
    algorithm=st.sampled_from(["wrap", "best_fit"]),
    runner=st.sampled_from(["synchronous", "threads"]),
    prefetch=st.integers(1, 6),
    group=st.integers(0, 1),
    cuts=st.lists(st.integers(0, 400), min_size=1, max_size=3),
    data=st.data(),
)
def test_resume_at_random_points_equals_uninterrupted(tmp_path, corpus_dir, seed, R, k, microbatch,
                                                      algorithm, runner, prefetch, group, cuts, data):
    opts = dict(seed=seed, R=R, k=k, microbatch=microbatch, algorithm=algorithm, runner=runner,
                prefetch_windows=prefetch, dp_degree=2, dp_group_id=group)
    first = build(corpus_dir, **opts)
    truth = ref_group_stream(first.spec, owned_lanes(first.description.settings), microbatch)
    got, state = [], None
    for cut in sorted(cuts) + [None]:  # successive resumes, each in a fresh pipeline
        pipe = build(corpus_dir, **{**opts, "prefetch_windows": data.draw(st.integers(1, 6))})
        if state is not None:
            pipe.load_state_dict(via_file(tmp_path, state))
        with pipe:
            it = iter(pipe)
            while len(got) < min(len(truth) if cut is None else cut, len(truth)):  # a resume at the end
                got.append(batch_rows(next(it)))  # would start the next pass (tests/pipeline/test_whole_run.py)
            state = pipe.state_dict()
    assert got == truth


def test_to_torch_state_counts_delivered_not_staged(corpus_dir):
    pipe = build(corpus_dir, runner="synchronous")
    truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
    it = pipe.to_torch(prefetch=4)
    got = [next(it) for _ in range(7)]
    state = pipe.state_dict()  # four more batches are staged ahead; they must not count
    assert [int(b["tokens"].shape[0]) for b in got] == [3] * 7
    resumed = build(corpus_dir, runner="synchronous").load_state_dict(state)
    assert take(resumed, 5) == truth[7:12]


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("before,after", [(2, 4), (4, 0), (0, 2)])
def test_dataloader_worker_count_change(corpus_dir, before, after):
    """A DataLoader cut at any batch resumes exactly under another worker count."""
    pipe = build(corpus_dir, runner="threads")
    truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
    got = []
    for t in pipe.to_torch_loader(num_workers=before):
        rows = [row[:n].tolist() for row, n in zip(t["tokens"], t["lengths"], strict=True)]
        got.append((int(t["lane"]), int(t["index_in_lane"]), rows))
        if len(got) == 7:
            break
    state = pipe.state_dict()
    pipe.close()
    resumed = build(corpus_dir, runner="threads").load_state_dict(state)
    for t in resumed.to_torch_loader(num_workers=after):
        rows = [row[:n].tolist() for row, n in zip(t["tokens"], t["lengths"], strict=True)]
        got.append((int(t["lane"]), int(t["index_in_lane"]), rows))
    resumed.close()
    lanes = [lane for lane, _, _ in truth]
    all_active = min(len(lanes) - lanes[::-1].index(lane) for lane in set(lanes))
    assert got[:all_active] == truth[:all_active]
    assert Counter(json.dumps(x) for x in got) == Counter(json.dumps(x) for x in truth)


def test_resume_on_distributed_runner(corpus_dir, tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        pipe = build(corpus_dir, client=client)
        truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
        head = take(pipe, 40)
        state = via_file(tmp_path, pipe.state_dict())
        pipe.close()
        resumed = build(corpus_dir, client=client).load_state_dict(state)
        with resumed:
            tail = [batch_rows(b) for b in resumed]
    assert head + tail == truth


# -- elastic: other DP degrees see the same global steps ---------------------------------


def run_groups(pipes, steps, per_step):
    """Advance every group ``steps`` optimizer steps; returns per-step sample multisets."""
    iters = [iter(p) for p in pipes]
    out = []
    for _ in range(steps):
        step = Counter()
        for it in iters:
            for _ in range(per_step):
                batch = next(it, None)
                if batch is not None:
                    step.update(samples(batch))
        out.append(step)
    return out


def elastic_pipes(corpus_dir, dp, mapping, microbatch, drop_last=True, **kw):
    return [
        build(corpus_dir, R=8, k=1, microbatch=None, runner="synchronous", dp_degree=dp,
              dp_group_id=g, mapping_strategy=mapping, batches_per_step=8 * (2 // microbatch) // dp, **kw)
        .batch(microbatch, drop_last=drop_last)
        for g in range(dp)
    ]


@pytest.mark.parametrize("mapping", ["contiguous", "interleaved"])
@pytest.mark.parametrize("dp", [1, 4, 8])
@pytest.mark.parametrize("microbatch", [2, 1])
def test_elastic_resume_keeps_global_steps(tmp_path, corpus_dir, dp, mapping, microbatch):
    """R=8: checkpoint dp=2 at a step boundary, resume on dp (microbatch 2 -> ``microbatch``)."""
    drop_last = microbatch == 2  # with a smaller microbatch, keep lane tails so both runs see every sample
    # every sample to the end: a packed stream's pass ends on each DP group's own last whole step
    # with drop_last_step (tests/unit/test_whole_steps.py), so only the steps before it are common
    every = {"drop_last_step": False}
    (truth_pipe,) = elastic_pipes(corpus_dir, 1, "contiguous", 2, drop_last, **every)
    truth = run_groups([truth_pipe], 80, 8)
    before = elastic_pipes(corpus_dir, 2, "contiguous", 2, drop_last, **every)
    head = run_groups(before, 20, 4)
    state = via_file(tmp_path, z.merge_states([p.state_dict() for p in before]))
    assert head == truth[:20]
    after = elastic_pipes(corpus_dir, dp, mapping, microbatch, drop_last, **every)
    for p in after:
        p.load_state_dict(state)
    tail = run_groups(after, 60, 8 * (2 // microbatch) // dp)
    full_steps = 52 - 20  # every lane still has a batch of 2 for this many more steps
    assert tail[:full_steps] == truth[20:20 + full_steps]
    # the same multiset over the whole run: nothing skipped, nothing repeated (the larger
    # dataset wraps into its second pass before the stream ends, so some samples occur twice)
    assert sum(head + tail, Counter()) == sum(truth, Counter())


@SLOW
@given(cut=st.integers(1, 100), dp=st.sampled_from([1, 4, 8]), mapping=st.sampled_from(["contiguous", "interleaved"]))
def test_mid_step_checkpoint_loses_and_repeats_nothing(corpus_dir, cut, dp, mapping):
    every = {"drop_last_step": False}  # the whole stream (a packed pass ends per group otherwise)
    before = elastic_pipes(corpus_dir, 2, "contiguous", 2, **every)
    with pytest.warns(ZephonWarning, match="into a step") if cut % 4 else warnings.catch_warnings():
        head = [samples(b) for p in before for b in take_batches(p, cut)]
        state = z.merge_states([p.state_dict() for p in before])
    after = elastic_pipes(corpus_dir, dp, mapping, 2, **every)
    tail = [samples(b) for p in after for b in p.load_state_dict(state)]
    (truth_pipe,) = elastic_pipes(corpus_dir, 1, "contiguous", 2, **every)
    truth = Counter(s for b in truth_pipe for s in samples(b))
    got = Counter(s for batch in head + tail for s in batch)
    assert got == truth


def test_a_mid_step_state_warns_with_the_default_step_size_too(corpus_dir):
    """R=4 with no step option: a step is one cycle of 4 batches, so 3 batches in is mid-step."""
    pipe = build(corpus_dir, runner="synchronous")
    assert not pipe.session.step_shape().explicit
    take(pipe, 3)
    with pytest.warns(ZephonWarning, match="3 batches into a step of 4"):
        pipe.state_dict()
    pipe = build(corpus_dir, runner="synchronous")
    take(pipe, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at a step boundary: silent
        pipe.state_dict()


def _mid_step_state(corpus_dir, cut):
    before = elastic_pipes(corpus_dir, 2, "contiguous", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZephonWarning)  # the mid-step state_dict() warning, tested above
        for p in before:
            take_batches(p, cut)
        return z.merge_states([p.state_dict() for p in before])


@pytest.mark.parametrize("dp", [1, 4])
def test_a_mid_step_state_resumed_on_another_topology_warns_once(corpus_dir, dp):
    state = _mid_step_state(corpus_dir, 5)  # 1 batch into each group's step of 4
    after = elastic_pipes(corpus_dir, dp, "contiguous", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for p in after:
            p.load_state_dict(state)
            take(p, 3)
    mine = [w for w in caught if "on another topology" in str(w.message)]
    assert len(mine) == len(after), [str(w.message) for w in caught]  # once per pipeline, at its load
    assert all("interleave its lanes differently" in str(w.message) for w in mine)
    assert all(w.filename == __file__ for w in mine)  # points at the user's load_state_dict() call


@pytest.mark.parametrize("cut, dp", [(5, 2), (8, 1), (8, 4), (4, 4)])
def test_a_step_aligned_or_same_topology_resume_is_silent(corpus_dir, cut, dp):
    """A mid-step state resumed on its own topology, or a step-aligned one on any: no warning."""
    state = _mid_step_state(corpus_dir, cut)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in elastic_pipes(corpus_dir, dp, "contiguous", 2):
            p.load_state_dict(state)
            take(p, 2)


def take_batches(pipe, n):
    out = []
    for batch in pipe:
        out.append(batch)
        if len(out) == n:
            break
    return out


def test_pointer_recomputed_from_lane_progress(corpus_dir):
    """A new topology starts at the owned lane with the fewest batches, lowest id on ties."""
    (one,) = elastic_pipes(corpus_dir, 1, "contiguous", 2)
    take(one, 11)  # lanes 0..2 have 2 batches, lanes 3..7 have 1
    with pytest.warns(ZephonWarning, match="3 batches into a step of 8"):
        state = one.state_dict()
    assert state["pointers"] == {"0/1:0,1,2,3,4,5,6,7": 3}
    assert [state["lanes"][str(lane)]["batches_delivered"] for lane in range(8)] == [2, 2, 2, 1, 1, 1, 1, 1]
    groups = elastic_pipes(corpus_dir, 4, "contiguous", 2)
    firsts = [next(iter(p.load_state_dict(state))).lane for p in groups]
    assert firsts == [0, 3, 4, 6]  # [0,1] tie -> 0, [2,3] -> 3, [4,5] tie -> 4, [6,7] tie -> 6


# -- state contents, files, merging and refusals ------------------------------------------


def test_state_schema_and_seed_from_checkpoint(corpus_dir, tmp_path):
    pipe = build(corpus_dir, seed=5, runner="synchronous")
    truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
    take(pipe, 9)
    state = pipe.state_dict()
    assert json.loads(json.dumps(state)) == state  # JSON-native
    assert type(state) is dict and "<table" in state_html(state)  # tables in a notebook, on request
    assert builtins_only(state) and builtins_only(via_file(tmp_path, state))
    assert state["format"] == schema.FORMAT and state["version"] == schema.VERSION
    assert state["step"]["global_batches"] == 4 and state["step"]["microbatch_size"] == 3
    assert state["fingerprint"] == pipe.fingerprint()
    assert state["config"]["source"]["seed"] == 5 and state["config"]["canonical_replicas"] == 4
    assert sorted(state["lanes"]) == ["0", "1", "2", "3"]
    assert state["lanes"]["0"]["batches_delivered"] == 3 and not state["lanes"]["0"]["finished"]
    other_seed = build(corpus_dir, seed=99, runner="synchronous")
    with pytest.warns(ZephonWarning, match="checkpoint's seed 5"):
        other_seed.load_state_dict(via_file(tmp_path, state))
    assert other_seed.fingerprint() == pipe.fingerprint()
    assert take(other_seed, 4) == truth[9:13]


def test_finished_lanes_are_recorded_and_skipped(corpus_dir):
    """Every sample (``drop_last_step=False``): lanes end where their data does, one by one."""
    pipe = build(corpus_dir, microbatch=None, runner="synchronous", drop_last_step=False).batch(3, drop_last=False)
    truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3, drop_last=False)
    cut = len(truth) - 5  # lane 2 (69 batches) has finished by then
    head = take(pipe, cut)
    state = pipe.state_dict()
    assert state["lanes"]["2"]["finished"]
    resumed = build(corpus_dir, microbatch=None, runner="synchronous",
                    drop_last_step=False).batch(3, drop_last=False).load_state_dict(state)
    assert head + [batch_rows(b) for b in resumed] == truth


@pytest.mark.parametrize("change,match", [
    (dict(R=8), "canonical_replicas=4"),
    (dict(algorithm="wrap"), r"operators\[2\]\.algorithm: checkpoint 'first_fit', pipeline 'wrap'"),
    (dict(k=3), "flush_every_k_chunks: checkpoint 2, pipeline 3"),
])
def test_refuses_other_data(corpus_dir, change, match):
    pipe = build(corpus_dir, runner="synchronous")
    take(pipe, 5)
    state = pipe.state_dict()
    other = build(corpus_dir, **{"runner": "synchronous", **change})
    with pytest.raises(StateError, match=match):
        other.load_state_dict(state)
    assert take(other, 3) == take(build(corpus_dir, **{"runner": "synchronous", **change}), 3)  # nothing consumed


def test_refuses_other_weights_and_datasets(corpus_dir):
    state = build(corpus_dir, runner="synchronous").state_dict()
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
    for ws, match in [
        (z.MixtureWorkSource([web, code], {"web": 1, "code": 1}, chunk_size=12, seed=5), "weights.web"),
        (z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=16, seed=5), "chunk_size"),
        (z.MixtureWorkSource([web], chunk_size=12, seed=5), "datasets"),
    ]:
        other = z.Pipeline(ws).tokenize().shuffle(16).pack(96, algorithm="first_fit").batch(3) \
            .options(canonical_replicas=4, flush_every_k_chunks=2)
        with pytest.raises(StateError, match=match):
            other.load_state_dict(state)


def test_refuses_bad_files(corpus_dir, tmp_path):
    pipe = build(corpus_dir, runner="synchronous")
    take(pipe, 5)
    path = z.save_state(tmp_path / "ckpt.json", pipe.state_dict())
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt.json"]  # no temp file left
    text = path.read_text()
    (tmp_path / "truncated.json").write_text(text[: len(text) // 2])
    with pytest.raises(StateError, match="truncated or corrupted"):
        z.load_state(tmp_path / "truncated.json")
    i = text.index('"batches_delivered": ') + len('"batches_delivered": ')
    (tmp_path / "corrupt.json").write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:])
    with pytest.raises(StateError, match="checksum"):
        z.load_state(tmp_path / "corrupt.json")
    newer = dict(pipe.state_dict(), version=99)
    with pytest.raises(StateError, match="version 99, newer"):
        build(corpus_dir, runner="synchronous").load_state_dict(newer)
    with pytest.raises(StateError, match="version 99, newer"):
        z.save_state(tmp_path / "newer.json", newer)
    with pytest.raises(StateError, match="no checkpoint"):
        z.load_state(tmp_path / "missing.json")
    assert isinstance(StateError("x"), ValueError)


def test_rank_state_alone_cannot_resume_other_lanes(corpus_dir):
    rank0 = build(corpus_dir, runner="synchronous", dp_degree=2, dp_group_id=0)
    take(rank0, 4)
    lone = rank0.state_dict()
    assert sorted(lone["lanes"]) == ["0", "1"]
    with pytest.raises(StateError, match=r"lanes \[2, 3\].*gather_state"):
        build(corpus_dir, runner="synchronous", dp_degree=2, dp_group_id=1).load_state_dict(lone)


def test_merge_states_requires_peers_to_agree(corpus_dir):
    a = build(corpus_dir, runner="synchronous", dp_degree=2, dp_group_id=0, batches_per_step=2)
    b = build(corpus_dir, runner="synchronous", dp_degree=2, dp_group_id=1, batches_per_step=2)
    peer = build(corpus_dir, runner="synchronous", dp_degree=2, dp_group_id=0, batches_per_step=2)
    take(a, 4), take(b, 4)
    it = iter(peer)
    for _ in range(4):
        next(it)
    merged = z.merge_states([a.state_dict(), b.state_dict(), peer.state_dict()])
    assert sorted(merged["lanes"]) == ["0", "1", "2", "3"] and merged["step"]["global_step"] == 2
    next(it), next(it)  # the peer ran one step further
    with pytest.raises(StateError, match="global_step"):
        z.merge_states([a.state_dict(), peer.state_dict()])
    diverged = peer.state_dict()
    diverged["step"] = a.state_dict()["step"]
    with pytest.raises(StateError, match=r"lanes \[0, 1\]"):
        z.merge_states([a.state_dict(), diverged])


def test_batches_per_step_must_make_steps_elastic(corpus_dir):
    pipe = build(corpus_dir, R=8, runner="synchronous", dp_degree=2, batches_per_step=3)
    with pytest.raises(ConfigError, match="use a multiple of 4 .the nearest is 4.*multiple of 8"):
        iter(pipe)
    with pytest.raises(ConfigError, match="positive int"):
        build(corpus_dir).options(batches_per_step=0)


# -- resume cost does not grow with the position -----------------------------------------


def test_resume_far_into_an_endless_stream(corpus_dir):
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    ws = z.MixtureWorkSource([web], chunk_size=12, seed=1, exhausted_policy="repeat")
    pipe = z.Pipeline(ws).tokenize().pack(64).batch(2).options(canonical_replicas=4, runner="synchronous")
    state = pipe.state_dict()
    for progress in state["lanes"].values():
        progress.update(window=1_000_000, offset=3, batches_delivered=5_000_000)
    first = next(iter(build_like(pipe).load_state_dict(state)))
    window = compute_window(pipe.spec, 0, 1_000_000).table
    assert first.lane == 0 and first.index_in_lane == 5_000_000
    assert first["tokens"][0, : first["lengths"][0]].tolist() == window.slice(3, 4).tokens.tolist()


def build_like(pipe):
    return z.Pipeline(pipe.spec.source).tokenize().pack(64).batch(2).options(canonical_replicas=4,
                                                                           runner="synchronous")


# -- the run ledger and `zephon-dask verify` ---------------------------------------------


def test_ledger_of_elastic_run_verifies_against_uninterrupted(corpus_dir, tmp_path, capsys):
    (truth,) = elastic_pipes(corpus_dir, 1, "contiguous", 2, ledger=str(tmp_path / "a"))
    with truth:
        for _ in truth:
            pass
    before = elastic_pipes(corpus_dir, 2, "contiguous", 2, ledger=str(tmp_path / "b"))
    run_groups(before, 10, 4)
    state = z.merge_states([p.state_dict() for p in before])
    for p in before:
        p.close()
    after = elastic_pipes(corpus_dir, 4, "interleaved", 2, ledger=str(tmp_path / "b"))
    for p in after:
        p.load_state_dict(state)
    run_groups(after, 30, 2)
    for p in after:
        p.close()
    lines = [json.loads(x) for x in (tmp_path / "b" / "rank-3.jsonl").read_text().splitlines()]
    assert sorted(lines[0]) == ["global_step", "index_in_lane", "lane", "sha256"]
    assert lines[0]["global_step"] == 10 and lines[-1]["global_step"] == 39  # the step count continues
    assert cli(["verify", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "40 global steps" in capsys.readouterr().out
    bad = tmp_path / "b" / "rank-1.jsonl"
    records = [json.loads(x) for x in bad.read_text().splitlines()]
    victim = next(r for r in records if r["global_step"] == 17)
    victim["sha256"] = "0" * 64
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli(["verify", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "global step 17 differs" in capsys.readouterr().out
    assert cli(["verify", str(tmp_path / "a"), str(tmp_path / "missing")]) == 2


def test_iterating_a_temporary_pipeline_keeps_it_alive(corpus_dir):
    """``for b in build(...)``: the pipeline object is only referenced by the iterator."""
    import gc

    truth = ref_group_stream(build(corpus_dir).spec, [0, 1, 2, 3], 3)
    got = []
    for batch in build(corpus_dir, runner="threads", prefetch_windows=2):
        if len(got) < 3:  # a dead pipeline would close its runner here
            gc.collect()
        got.append(batch_rows(batch))
    assert got == truth
    assert len(list(build(corpus_dir, runner="threads").to_torch())) == len(truth)
