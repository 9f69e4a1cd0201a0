"""The global-step contract: G batches per global step is a data setting kept across resumes.

The truth is an uninterrupted run's ledger; ``zephon-dask verify`` compares
it step by step with runs resumed on other degrees (``docs/checkpointing.md``,
the global-step contract).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zephon_dask as z
from tests.helpers.pipelines import build
from zephon_dask.cli import main as cli
from zephon_dask.errors import ConfigError, StateError
from zephon_dask.pipeline.ranks import owned_lanes
from zephon_dask.state import schema, steps


def has(step: dict, want: dict) -> bool:
    """``step`` holds ``want``'s fields with its values (a later version may record more)."""
    return {k: step.get(k) for k in want} == want

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"


def per_rank_recipe(tmp_path, line="batches_per_step = 4"):
    """The example recipe with its step setting replaced by ``line`` (paths kept absolute)."""
    text = EXAMPLE.read_text().replace('path = "data/', f'path = "{EXAMPLE.parent}/data/')
    lines = [x for x in text.splitlines() if not x.startswith("global_batches_per_step")]
    path = tmp_path / "recipe.toml"
    path.write_text("\n".join(lines + [line]) + "\n")
    return path


def run(recipe, *args):
    return cli(["run", str(recipe), "--runner", "synchronous", *args])


@pytest.mark.parametrize("setting", ["batches_per_step = 4", "global_batches_per_step = 4"])
def test_cli_reproduction_resumed_on_two_groups_verifies(tmp_path, capsys, setting):
    """The issue's reproduction: dp=1 for 20 steps, then dp=2 groups 0 and 1 resume; the
    recipe's per-rank batches_per_step (written for dp=1) gives way to the checkpoint's G."""
    recipe = per_rank_recipe(tmp_path, setting)
    a, b, ckpt = tmp_path / "a", tmp_path / "b", tmp_path / "ck.json"
    assert run(recipe, "--steps", "40", "--ledger", str(a)) == 0
    assert run(recipe, "--steps", "20", "--ledger", str(b), "--checkpoint", str(ckpt)) == 0
    assert z.load_state(ckpt)["step"]["global_batches"] == 4
    for group in (0, 1):
        assert run(recipe, "--steps", "20", "--ledger", str(b), "--resume", str(ckpt),
                   "--dp-degree", "2", "--dp-group-id", str(group)) == 0
        assert "global step: 4 batches, 2 per rank at dp_degree=2" in capsys.readouterr().out
    assert cli(["verify", str(a), str(b)]) == 0
    assert "OK: 40 global steps (0..39), 160 batches: identical" in capsys.readouterr().out


def test_cli_chain_dp1_dp2_dp4_verifies(tmp_path, capsys):
    recipe = EXAMPLE
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(recipe, "--steps", "30", "--ledger", str(a)) == 0
    assert run(recipe, "--steps", "10", "--ledger", str(b), "--checkpoint", str(tmp_path / "dp1.json")) == 0
    for group in (0, 1):
        assert run(recipe, "--steps", "10", "--ledger", str(b), "--resume", str(tmp_path / "dp1.json"),
                   "--dp-degree", "2", "--dp-group-id", str(group),
                   "--checkpoint", str(tmp_path / f"dp2-{group}.json")) == 0
    merged = z.merge_states([z.load_state(tmp_path / f"dp2-{g}.json") for g in (0, 1)])
    assert merged["step"]["global_step"] == 20 and merged["step"]["global_batches"] == 4
    z.save_state(tmp_path / "dp2.json", merged)
    for group in range(4):
        assert run(recipe, "--steps", "10", "--ledger", str(b), "--resume", str(tmp_path / "dp2.json"),
                   "--dp-degree", "4", "--dp-group-id", str(group)) == 0
    capsys.readouterr()
    assert cli(["verify", str(a), str(b)]) == 0
    assert "OK: 30 global steps (0..29), 120 batches: identical" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::zephon_dask.errors.ElasticityWarning")
def test_cli_refuses_a_resume_that_changes_the_step(tmp_path, capsys):
    ckpt = tmp_path / "ck.json"
    assert run(EXAMPLE, "--steps", "3", "--checkpoint", str(ckpt)) == 0
    capsys.readouterr()
    assert run(EXAMPLE, "--steps", "3", "--resume", str(ckpt), "--global-batches-per-step", "8") == 2
    err = capsys.readouterr().err
    assert "step.global_batches: checkpoint 4, pipeline 8" in err and "Drop the setting" in err
    assert run(EXAMPLE, "--steps", "3", "--resume", str(ckpt), "--dp-degree", "3", "--dp-group-id", "0") == 2
    assert "Valid degrees: [1, 2, 4]" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::zephon_dask.errors.ElasticityWarning")
def test_global_setting_serves_every_degree(corpus_dir):
    """One setting for every degree: the value right for dp=2 is no longer refused at dp=1."""
    for dp, per_rank in [(1, 8), (2, 4), (4, 2), (8, 1)]:
        pipe = build(corpus_dir, R=8, global_batches_per_step=8, dp_degree=dp, dp_group_id=0)
        shape = pipe.session.step_shape()
        assert (shape.per_rank, shape.global_batches, shape.explicit) == (per_rank, 8, True)
    with pytest.raises(ConfigError, match="multiple of canonical_replicas=8, .*the nearest is 16"):
        build(corpus_dir, R=8).options(global_batches_per_step=12)
    with pytest.raises(ConfigError, match="contradicts global_batches_per_step=8"):
        build(corpus_dir, R=8, global_batches_per_step=8, batches_per_step=2, dp_degree=2).session.step_shape()
    with pytest.raises(ConfigError, match=r"Valid degrees: \[1, 2, 4, 8\]"):
        build(corpus_dir, R=8, global_batches_per_step=8, dp_degree=3, dp_group_id=0).session.step_shape()


def test_resume_derives_the_per_rank_count_and_refuses_a_change(corpus_dir):
    one = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", global_batches_per_step=16)
    it = iter(one)
    for _ in range(32):
        next(it)
    state = one.state_dict()
    assert has(state["step"], {"global_step": 2, "batches_in_step": 0, "batches_per_step": 16, "dp_degree": 1,
                               "global_batches": 16, "microbatch_size": 2})
    four = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", dp_degree=4, dp_group_id=1)
    assert four.load_state_dict(state).session.step_shape().per_rank == 4
    wrong = build(corpus_dir, R=8, k=1, microbatch=2, runner="synchronous", dp_degree=4, dp_group_id=1,
                  batches_per_step=2)
    with pytest.raises(StateError, match="(?s)step.global_batches: checkpoint 16, pipeline 8.*batches_per_step=4"):
        wrong.load_state_dict(state)
    assert wrong.session.resume is None  # a refusal changes nothing
    # a smaller microbatch keeps the samples per global step: 16 x 2 = 32 x 1
    small = build(corpus_dir, R=8, k=1, microbatch=1, runner="synchronous", dp_degree=2, dp_group_id=0)
    assert small.load_state_dict(state).session.step_shape().per_rank == 16
    odd = build(corpus_dir, R=8, k=1, microbatch=3, runner="synchronous")
    with pytest.raises(StateError, match=r"microbatch size in \[1, 2, 4\]"):
        odd.load_state_dict(state)


def test_step_shape_is_pure_and_total():
    """Every (R, d, G) either gives G / d batches per rank with d | R, or a typed error."""
    for replicas in (1, 2, 4, 6, 8):
        for g in range(replicas, 4 * replicas + 1, replicas):
            for d in range(1, replicas + 1):
                try:
                    shape = steps.step_shape(replicas, d, replicas // d, None, g, None)
                except ConfigError as exc:
                    assert replicas % d or g % d, exc
                    assert str(steps.valid_degrees(replicas, g)) in str(exc)
                else:
                    assert replicas % d == 0 and shape.per_rank * d == g
                try:
                    resumed = steps.step_shape(replicas, d, replicas // d, None, None, g)
                except StateError:
                    assert replicas % d or g % d
                else:
                    assert resumed.per_rank * d == g and not resumed.explicit


def test_plan_and_explain_show_the_contract(capsys):
    assert cli(["plan", str(EXAMPLE), "--dp", "1,2,3,4"]) == 0
    out = capsys.readouterr().out
    assert "global_batches_per_step=4" in out and "2 batches per rank per step" in out
    assert "refused (valid: [1, 2, 4])" in out
    assert cli(["explain", str(EXAMPLE), "--dp-degree", "2", "--dp-group-id", "1"]) == 0
    assert "4 batches per global step, 2 per rank at dp_degree=2" in capsys.readouterr().out


def test_v1_checkpoint_written_by_the_previous_release_resumes_exactly(corpus_dir):
    """tests/data/state-v1.json: written by the v1 release after 10 batches of
    ``build(corpus, runner="synchronous", batches_per_step=4)`` (mid-step: 2 into step 2)."""
    from tests.helpers.oracles import batch_rows, ref_group_stream

    path = Path(__file__).resolve().parents[1] / "data" / "state-v1.json"
    assert json.loads(path.read_text())["state"]["version"] == 1
    state = z.load_state(path)
    assert state["version"] == schema.VERSION and type(state) is dict
    assert has(state["step"], {"global_step": 2, "batches_in_step": 2, "batches_per_step": 4, "dp_degree": 1,
                               "global_batches": 4, "microbatch_size": 0})
    pipe = build(corpus_dir, runner="synchronous", batches_per_step=4)
    truth = ref_group_stream(pipe.spec, owned_lanes(pipe.description.settings), 3)
    pipe.load_state_dict(state)
    assert [batch_rows(b) for b in pipe] == truth[10:]
    assert pipe.state_dict()["step"]["global_step"] == (len(truth) - 10 + 2) // 4 + 2
