"""Mixture schedules: the chunk order across phases against a sample-walking oracle, the
conversion of global steps into chunk blocks, elastic resumes across a phase boundary
(verified with the ledger), and what a resume may change (``docs/concepts.md``, mixture
schedules; ``docs/checkpointing.md``)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import ref_schedule_stream
from tests.helpers.pipelines import write_corpus
from zephon_dask.curriculum import MixtureWorkSource
from zephon_dask.curriculum.schedule import min_chunk_size
from zephon_dask.errors import ConfigError, StateError
from zephon_dask.inspect import phase_plan, plan_table
from zephon_dask.pipeline import resume
from zephon_dask.state import State
from zephon_dask.state.ledger import verify_ledgers


class Sized:
    def __init__(self, name, sizes):
        self.name, self.shard_sizes = name, tuple(sizes)


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 3))
    datasets = [(f"d{i}", draw(st.lists(st.integers(1, 20), min_size=1, max_size=3))) for i in range(n)]
    replicas = draw(st.integers(1, 4))
    count = draw(st.integers(1, 3))
    blocks = sorted(draw(st.sets(st.integers(1, 12), min_size=count - 1, max_size=count - 1)))
    starts = [0] + [b * replicas for b in blocks]
    weights = []
    for _ in starts:
        ws = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        assume(any(ws))
        weights.append(ws)
    need = max(min_chunk_size([Fraction(w, sum(ws)) for w in ws]) for ws in weights)
    chunk_size = draw(st.integers(need, max(need, 12)))
    policy = draw(st.sampled_from([None, "stop", "repeat"]))
    kw = {"chunk_size": chunk_size, "seed": draw(st.integers(0, 2**32)),
          "shuffle_shards": draw(st.booleans()), "shuffle_within_shard": draw(st.booleans())}
    if policy is None:
        kw["stop_after_passes"] = draw(st.integers(1, 2))
    else:
        kw["exhausted_policy"] = policy
        kw["max_repeats"] = 1 if policy == "repeat" else None
    return datasets, list(zip(starts, weights)), replicas, kw


def _source(datasets, phase_list, kw):
    names = [n for n, _ in datasets]
    schedule = [(g, dict(zip(names, ws))) for g, ws in phase_list]
    try:
        return MixtureWorkSource([Sized(n, s) for n, s in datasets], schedule=schedule,
                                 schedule_unit="chunk", **kw)
    except ConfigError as exc:  # a phase past the end, or a stream the last phase never ends
        assume(not any(s in str(exc) for s in ("never", "no chunk")))
        raise


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_chunks_across_phases_match_the_sample_walking_oracle(cfg):
    datasets, phase_list, replicas, kw = cfg
    source = _source(datasets, phase_list, kw)
    truth = ref_schedule_stream(datasets, phase_list, kw["chunk_size"], kw["seed"],
                                kw.get("stop_after_passes", 1), kw.get("exhausted_policy"),
                                kw.get("max_repeats"), max_chunks=10_000,
                                shuffle_shards=kw["shuffle_shards"], shuffle_within=kw["shuffle_within_shard"])
    assert len(source) == len(truth)
    for g in range(len(truth)):  # any chunk, directly, in any order
        assert [tuple(p) for p in source.chunk(g)] == truth[g]
        assert source.chunk_counts(g).tolist() == [sum(p[0] == n for p in truth[g]) for n in source.names]
        assert source.phase_of(g) == max(p for p, (start, _) in enumerate(phase_list) if start <= g)
    for lane in range(replicas):  # every lane switches phase at the same block
        switch = [j for j, g in enumerate(source.lane_chunks(lane, replicas))
                  if j and source.phase_of(g) != source.phase_of(source.lane_chunks(lane, replicas)[j - 1])]
        assert switch == [g // replicas for g, _ in phase_list[1:] if g < len(source)][:len(switch)]


def test_a_dataset_absent_early_starts_at_its_first_sample():
    web, math = Sized("web", [40]), Sized("math", [30])
    plain = MixtureWorkSource([math], chunk_size=4, seed=3)
    sched = MixtureWorkSource([web, math], schedule=[(0, {"web": 1}), (4, {"web": 1, "math": 1})],
                              schedule_unit="chunk", chunk_size=4, seed=3)
    math_order = [p for g in range(4) for p in plain.chunk(g)]
    from_sched = [p for g in range(4, 12) for p in sched.chunk(g) if p.dataset == "math"]
    assert from_sched == math_order[:len(from_sched)] and len(from_sched) == 16
    assert sched.allocation(4) == {"web": 16, "math": 0}


@pytest.mark.parametrize("schedule, unit, match", [
    ([(0, {"web": 1}), (0, {"web": 1})], "step", "repeats"),
    ([(0, {"web": 1}), (9, {"web": 1}), (5, {"web": 2})], "step", "comes before"),
    ([(3, {"web": 1})], "step", "first phase must start at 0"),
    ([(0, {"web": 1, "nope": 1})], "step", r"unknown datasets \['nope'\]"),
    ([(0, {"web": -1})], "step", "must be > 0"),
    ([(0, {"web": "0.5"})], "step", "not a number"),
    ([(0, {"web": 0, "math": 0})], "step", "no dataset a positive weight"),
    ([(0, {"web": 1}), (-4, {"web": 1})], "step", "int >= 0"),
    ({0: {"web": 1}}, "step", "list of"),
    ([(0, {"web": 1})], "tokens", "schedule_unit='tokens' is unknown"),
    ([(0, {"web": 1}), (5, {"math": 1})], "chunk", "never end"),
    ([(0, {"web": 1, "math": 1}), (10_000, {"web": 1})], "chunk", "never be reached"),
])
def test_bad_schedules_are_refused_at_construction(schedule, unit, match):
    with pytest.raises(ConfigError, match=match):
        MixtureWorkSource([Sized("web", [40]), Sized("math", [30])], schedule=schedule,
                          schedule_unit=unit, chunk_size=4)


def test_zero_weights_of_any_number_type_and_chunk_sizes_per_phase():
    import numpy as np

    web, math = Sized("web", [40]), Sized("math", [30])
    source = MixtureWorkSource([web, math], chunk_size=4, schedule=[(0, {"web": 1, "math": np.int64(0)}),
                                                                    (5, {"web": 0.5, "math": np.float64(0.5)})])
    assert source.phases[0].weights == (1, 0)
    with pytest.raises(ConfigError, match=r"too small for schedule phase 1's 3 datasets[\s\S]*chunk_size >= 6"):
        MixtureWorkSource([web, math, Sized("code", [9])], chunk_size=2,
                          schedule=[(0, {"web": 1}), (5, {"web": 1, "math": 1, "code": 1})])


def test_weights_and_schedule_together_are_refused():
    with pytest.raises(ConfigError, match="not both"):
        MixtureWorkSource([Sized("web", [40])], {"web": 1}, schedule=[(0, {"web": 1})])


def test_a_step_schedule_needs_a_pipeline_or_chunk_starts():
    source = MixtureWorkSource([Sized("web", [40]), Sized("math", [30])], chunk_size=4,
                               schedule=[(0, {"web": 1}), (5, {"math": 1, "web": 1})])
    with pytest.raises(ConfigError, match="a Pipeline converts them"):
        source.chunk(0)
    assert source.with_phase_chunks([0, 8]).schedule.chunks == (0, 8)
    assert "length set by a Pipeline, 2 phases" in repr(source)
    assert "set by a Pipeline" in source._repr_html_() and "mixture schedule" in source._repr_html_()


# -- pipelines: steps -> chunk blocks, elastic resumes, changes on resume ---------------------------

R, K, MB = 4, 2, 3
SCHEDULE = [(0, {"web": 3, "code": 1}), (6, {"web": 1, "code": 1, "math": 1})]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("sched")
    write_corpus(root / "web", 3, 60, 1, "web")
    write_corpus(root / "code", 2, 50, 2, "code")
    write_corpus(root / "math", 1, 60, 3, "math")
    return [z.Dataset.from_jsonl(n, str(root / n), progress=False) for n in ("web", "code", "math")]


def pipeline(corpus, schedule=SCHEDULE, pack=False, **options):
    source = z.MixtureWorkSource(corpus, schedule=schedule, chunk_size=6, seed=5)
    p = z.Pipeline(source).tokenize()
    if pack:
        p = p.shuffle(16).pack(96)
    return p.batch(MB).options(canonical_replicas=R, flush_every_k_chunks=K, runner="synchronous", **options)


def run_steps(pipe, steps):
    """Iterate ``steps`` global steps of this group's share; the state at the step boundary."""
    batches = iter(pipe)
    per = pipe.session.step_shape().per_rank
    out = [next(batches) for _ in range(steps * per)]
    return pipe.state_dict(), out


def test_step_starts_resolve_to_blocks_and_begin_exactly_when_rows_are_samples(corpus):
    pipe = pipeline(corpus)
    # a lane gives G x MB / R = 3 samples per step; step 6 is lane sample 18, chunk block 3
    assert pipe.spec.source.phase_chunks == (0, 12)
    plan = phase_plan(pipe)
    assert [(p.step, p.block, p.begin_step, p.exact) for p in plan] == [(0, 0, 0, True), (6, 3, 6, True)]
    _, batches = run_steps(pipe, 10)
    first_math = min(i // R for i, b in enumerate(batches) if b.dataset_tokens()[2] > 0)  # math: phase 1 only
    assert first_math == plan[1].begin_step
    assert pipe.fingerprint() == pipeline(corpus).fingerprint()  # recorded, reproducible


def test_packed_pipelines_estimate_the_step_deterministically(corpus):
    pipe = pipeline(corpus, pack=True)
    plan = phase_plan(pipe)
    assert not plan[1].exact and plan[0].rows_per_sample > 1  # documents wrap over several rows
    # phase 1 starts at the block nearest to step 6's estimated lane sample
    q = Fraction(R * MB, R)
    assert plan[1].block == round(6 * q / plan[0].rows_per_sample / 6)
    assert pipeline(corpus, pack=True).spec.source.phase_chunks == pipe.spec.source.phase_chunks


def test_chunk_starts_must_be_whole_blocks(corpus):
    source = z.MixtureWorkSource(corpus, schedule=[(0, {"web": 1, "code": 1}), (6, {"web": 1, "code": 1, "math": 1})],
                                 schedule_unit="chunk",
                                 chunk_size=6)
    with pytest.raises(ConfigError, match="use chunk 4 or 8"):
        phase_plan(z.Pipeline(source).tokenize().batch(MB).options(canonical_replicas=R))


def test_steps_too_close_for_distinct_blocks_are_refused(corpus):
    with pytest.raises(ConfigError, match="same chunk block"):
        phase_plan(pipeline(corpus, [SCHEDULE[0], (5, {"web": 1}), (6, SCHEDULE[1][1])]))  # blocks 2.5, 3


def test_elastic_resume_across_the_boundary_verifies_against_an_uninterrupted_run(corpus, tmp_path):
    """dp 1 for 4 steps, dp 2 for 6 (crossing the phase boundary), dp 4 for 6: the same
    global steps as one uninterrupted run."""
    a, b = tmp_path / "a", tmp_path / "b"
    for pack in (False, True):
        a, b = tmp_path / f"a{pack}", tmp_path / f"b{pack}"
        whole = pipeline(corpus, pack=pack, ledger=str(a))
        begin = phase_plan(whole)[1].begin_step
        assert 4 < begin < 10
        run_steps(whole, 16)
        state, _ = run_steps(pipeline(corpus, pack=pack, ledger=str(b)), 4)
        parts = []
        for group in range(2):
            p = pipeline(corpus, pack=pack, ledger=str(b), dp_degree=2, dp_group_id=group).load_state_dict(state)
            parts.append(run_steps(p, 6)[0])
        merged = z.merge_states(parts)
        assert resume.frontier(State.from_dict(merged), K) > whole.spec.source.phase_chunks[1] // R  # crossed
        for group in range(4):
            p = pipeline(corpus, pack=pack, ledger=str(b), dp_degree=4, dp_group_id=group).load_state_dict(merged)
            run_steps(p, 6)
        ok, message = verify_ledgers(a, b)
        assert ok, message
        assert "16 global steps" in message


@pytest.fixture(scope="module")
def crossed(corpus):
    """The state after 10 steps: phase 1 (from step 6) has started."""
    return run_steps(pipeline(corpus), 10)[0]


def test_changing_a_started_phase_is_refused_with_the_diff(corpus, crossed):
    edited = [SCHEDULE[0], (6, {"web": 2, "code": 1, "math": 1})]
    with pytest.raises(StateError, match=r"already started[\s\S]*schedule\[1\]\.weights\[web\]: "
                                         r"checkpoint '1/3', pipeline '1/2'"):
        pipeline(corpus, edited).load_state_dict(crossed)
    with pytest.raises(StateError, match=r"schedule\[1\]\.start: checkpoint \('step', 6\), pipeline \('step', 7\)"):
        pipeline(corpus, [SCHEDULE[0], (7, SCHEDULE[1][1])]).load_state_dict(crossed)
    with pytest.raises(StateError, match=r"schedule\[1\]: checkpoint"):
        pipeline(corpus, SCHEDULE[:1]).load_state_dict(crossed)


def test_appending_a_future_phase_keeps_the_steps_before_it(corpus, crossed, tmp_path):
    later = [*SCHEDULE, (14, {"web": 1, "code": 1, "math": 2})]
    resumed = pipeline(corpus, later).load_state_dict(crossed)
    assert resumed.spec.source.phase_chunks[:2] == (0, 12)
    ahead = run_steps(resumed, 4)[1]
    truth = run_steps(pipeline(corpus), 14)[1][10 * R:]
    assert [b["tokens"].tobytes() for b in ahead] == [b["tokens"].tobytes() for b in truth]
    # a phase not started yet may be edited; once its first window is begun it may not
    edited = [*SCHEDULE, (16, {"web": 1, "code": 2, "math": 2})]
    assert pipeline(corpus, edited).load_state_dict(crossed).spec.source.phase_chunks == (0, 12, 32)
    with pytest.raises(StateError, match=r"schedule\[2\]\.start: checkpoint \('step', 14\), pipeline \('step', 16\)"):
        pipeline(corpus, edited).load_state_dict(resumed.state_dict())  # step 14: block 7's window begun
    with pytest.raises(StateError, match="already delivered samples up to block 6"):
        pipeline(corpus, [*SCHEDULE, (8, {"web": 1, "code": 1, "math": 2})]).load_state_dict(crossed)


def test_a_schedule_may_be_appended_to_a_run_without_one(corpus):
    plain = z.MixtureWorkSource(corpus, {"web": 3, "code": 1, "math": 1}, chunk_size=6, seed=5)
    pipe = z.Pipeline(plain).tokenize().batch(MB).options(canonical_replicas=R, flush_every_k_chunks=K,
                                                          runner="synchronous")
    state, _ = run_steps(pipe, 2)
    later = pipeline(corpus, [(0, {"web": 3, "code": 1, "math": 1}), (20, {"web": 1, "code": 1, "math": 1})])
    assert later.load_state_dict(state).spec.source.phase_chunks == (0, 20 * R * MB // 6 // R * R)


def test_explain_plan_and_stats_show_the_phases(corpus):
    pipe = pipeline(corpus)
    for text in (str(pipe.explain()), str(plan_table(pipe, dp_degrees=(1, 2)))):
        assert "mixture schedule" in text
        assert "step 6           3            12           6" in text
    assert "(estimated: rows are not samples)" in str(pipeline(corpus, pack=True).explain())
    run_steps(pipe, 10)
    stats = pipe.stats()
    first, second = stats.phases
    assert (first["from_step"], first["to_step"], second["from_step"]) == (0, 6, 6)
    assert first["realized"]["math"] == 0 and second["realized"]["math"] > 0.2
    assert second["target"] == {"web": 1 / 3, "code": 1 / 3, "math": 1 / 3}
    assert "mixture by schedule phase" in str(stats)
    assert second["realized"] == second["sample_share"] and second["token_target"] is None  # weighted by samples
    overall = {m["dataset"]: m["target"] for m in stats.mixture}  # sample targets, blended by samples delivered
    assert overall["math"] == pytest.approx(second["samples"] / (first["samples"] + second["samples"]) / 3)


def _recipe(tmp_path, corpus, phases_toml, weights=""):
    datasets = "".join(f'[[datasets]]\nname = "{d.name}"\npath = "{d.source}"\n{weights}\n' for d in corpus)
    text = (datasets + phases_toml + "\n[source]\nchunk_size = 6\nseed = 5\n[tokenize]\n[batch]\nmicrobatch_size = 3\n"
            "[options]\ncanonical_replicas = 4\nflush_every_k_chunks = 2\n")
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


SCHEDULE_TOML = """
[[mixture.schedule]]
step = 0
weights = { web = 3, code = 1 }

[[mixture.schedule]]
step = 6
weights = { web = 1, code = 1, math = 1 }
"""


def test_a_recipe_schedule_builds_the_same_pipeline(corpus, tmp_path):
    from zephon_dask.recipe import load_recipe

    recipe = load_recipe(_recipe(tmp_path, corpus, SCHEDULE_TOML))
    assert recipe.schedule == tuple(SCHEDULE) and recipe.schedule_unit == "step"
    assert z.Pipeline.from_config(recipe).fingerprint() == pipeline(corpus).options(runner="distributed").fingerprint()


@pytest.mark.parametrize("toml, weights, error, match", [
    (SCHEDULE_TOML.replace("step = 6", "step = 0"), "", "RecipeError", "repeats"),
    (SCHEDULE_TOML.replace("step = 0", "step = 2"), "", "RecipeError", "first phase must start at 0"),
    (SCHEDULE_TOML.replace("math = 1", "maths = 1"), "", "RecipeError", r"unknown datasets \['maths'\]"),
    (SCHEDULE_TOML.replace("code = 1 }\n\n", 'code = "1" }\n\n'), "", "RecipeTypeError", "must be an integer or a number"),
    (SCHEDULE_TOML.replace("web = 3", "web = -3"), "", "RecipeError", "must be > 0"),
    (SCHEDULE_TOML.replace("step = 6", "chunk = 8"), "", "RecipeKeyError", "mixes step = and chunk ="),
    (SCHEDULE_TOML, "weight = 1", "RecipeKeyError", "both set the mixture"),
    (SCHEDULE_TOML.replace("step = 6\n", ""), "", "RecipeKeyError", "needs a start"),
])
def test_bad_recipe_schedules_are_refused_on_load(corpus, tmp_path, toml, weights, error, match):
    from zephon_dask import errors
    from zephon_dask.recipe import load_recipe

    with pytest.raises(getattr(errors, error), match=match):
        load_recipe(_recipe(tmp_path, corpus, toml, weights))


def test_cli_chain_dp1_dp2_dp4_across_a_phase_boundary_verifies(tmp_path, capsys):
    """The example recipe with an annealing phase: dp 1 -> 2 -> 4 with the CLI, the phase
    beginning during the dp 2 leg, verified with ``zephon-dask verify``."""
    from pathlib import Path

    from zephon_dask.cli import main as cli

    example = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"
    text = example.read_text().replace('path = "data/', f'path = "{example.parent}/data/')
    text = "\n".join(x for x in text.splitlines() if not x.startswith("weight ="))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text + "\n[[mixture.schedule]]\nstep = 0\nweights = { prose = 0.6, code = 0.4 }\n"
                      "[[mixture.schedule]]\nstep = 14\nweights = { prose = 0.1, code = 0.9 }\n")
    phase = phase_plan(z.Pipeline.from_config(recipe))[1]
    assert 10 < phase.begin_step < 20

    def run(*args):
        return cli(["run", str(recipe), "--runner", "synchronous", "--steps", "10", *args])

    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(["run", str(recipe), "--runner", "synchronous", "--steps", "30", "--ledger", str(a)]) == 0
    assert run("--ledger", str(b), "--checkpoint", str(tmp_path / "dp1.json")) == 0
    for group in (0, 1):
        assert run("--ledger", str(b), "--resume", str(tmp_path / "dp1.json"), "--dp-degree", "2",
                   "--dp-group-id", str(group), "--checkpoint", str(tmp_path / f"dp2-{group}.json")) == 0
    merged = z.merge_states([z.load_state(tmp_path / f"dp2-{g}.json") for g in (0, 1)])
    z.save_state(tmp_path / "dp2.json", merged)
    assert merged["config"]["source"]["schedule"][1] == {"step": 14, "chunk": phase.chunk,
                                                         "weights": {"prose": "1/10", "code": "9/10"}}
    assert resume.frontier(State.from_dict(merged), 2) > phase.block  # the dp 2 leg crossed into the new phase
    for group in range(4):
        assert run("--ledger", str(b), "--resume", str(tmp_path / "dp2.json"), "--dp-degree", "4",
                   "--dp-group-id", str(group)) == 0
    capsys.readouterr()
    assert cli(["verify", str(a), str(b)]) == 0
    assert "OK: 30 global steps (0..29), 120 batches: identical" in capsys.readouterr().out
    assert cli(["explain", str(recipe)]) == 0
    assert "mixture schedule" in capsys.readouterr().out
