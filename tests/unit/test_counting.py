"""``num_steps()`` / ``step_count()``: the global steps of a finite pipeline, against an oracle that
iterates every DP group's pipeline and counts what it delivers; where the count shows (``repr``,
``explain()``), and that ``len()`` stays a typed error."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import zephon_dask as z
from tests.helpers.pipelines import write_corpus
from zephon_dask.errors import EndlessStreamError, UnsizedPipelineError
from zephon_dask.inspect import step_count
from zephon_dask.pipeline.ranks import owned_lanes

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"


def oracle(pipeline) -> tuple[int, int, int]:
    """(full global steps, batches, batches after them): every group's pipeline iterated to its
    end with every sample kept. With ``drop_last_step`` a step holds G / R full batches of every lane and
    the steps are those every lane completes; without, each group takes its step shape's batches
    per step and the steps are those every group completes."""
    degree, _ = pipeline.session.identity()
    microbatch = pipeline.description.batch.microbatch_size
    lanes, delivered, per_rank = Counter(), [], []  # lanes: full batches per lane
    for group in range(degree):
        p = pipeline.options(dp_group_id=group, runner="synchronous", drop_last_step=False)
        if not owned_lanes(p.description.settings):
            continue
        with p:
            got = [(b.lane, b.num_samples == microbatch) for b in p]
        lanes.update(lane for lane, full in got if full)
        delivered.append(len(got))
        per_rank.append(p.session.step_shape().per_rank)
    total = sum(delivered)
    if pipeline.spec.drop_last_step:
        replicas = pipeline.description.settings["canonical_replicas"]
        per_lane = pipeline.session.step_shape().global_batches // replicas
        steps = min(lanes[lane] // per_lane for lane in range(replicas))
        return steps, total, total - steps * per_lane * replicas
    steps = min(b // r for b, r in zip(delivered, per_rank, strict=True))
    return steps, total, total - steps * sum(per_rank)


def test_the_example_recipe_gives_53_global_steps():
    pipeline = z.Pipeline.from_config(RECIPE).options(runner="synchronous")
    count = step_count(pipeline)
    assert (count.steps, count.batches, count.left) == oracle(pipeline) == (53, 213, 1)
    assert pipeline.num_steps() == 53 and count.counted and count.dropped
    assert "53 global steps (213 batches; 1 dropped after the last whole step)" == count.describe()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = write_corpus(tmp_path_factory.mktemp("counting") / "web", n_files=2, docs=30, seed=3)
    return z.Dataset.from_jsonl("web", str(root), progress=False)


def variants(small):
    source = z.MixtureWorkSource([small], chunk_size=5, seed=2, stop_after_passes=2)
    base = z.Pipeline(source).tokenize()
    packed = base.shuffle(8).pack(64, algorithm="best_fit").batch(3)
    return {
        "best_fit": packed.options(canonical_replicas=4, flush_every_k_chunks=2),
        "wrap, G=8, dp=2 interleaved": base.pack(48).batch(2).options(
            canonical_replicas=4, flush_every_k_chunks=1, global_batches_per_step=8, dp_degree=2,
            mapping_strategy="interleaved"),
        "keep last, dp=3 uneven": base.pack(64, algorithm="first_fit").batch(4, drop_last=False).options(
            canonical_replicas=4, flush_every_k_chunks=3, dp_degree=3),
        "every sample, dp=3 uneven": base.pack(64, algorithm="first_fit").batch(4, drop_last=False).options(
            canonical_replicas=4, flush_every_k_chunks=3, dp_degree=3, drop_last_step=False),
        "filter": base.filter(lambda r: len(r["text"]) % 3 != 0, name="thirds", version=1).batch(2).options(
            canonical_replicas=2, flush_every_k_chunks=2),
        "rows are samples": base.shuffle(4).batch(3).options(canonical_replicas=3, flush_every_k_chunks=2),
    }


@pytest.mark.filterwarnings("ignore::zephon_dask.errors.ElasticityWarning")  # dp=3 over 4 lanes
@pytest.mark.parametrize("name", ["best_fit", "wrap, G=8, dp=2 interleaved", "keep last, dp=3 uneven",
                                  "every sample, dp=3 uneven", "filter", "rows are samples"])
def test_step_count_matches_iterating_every_group(small, name):
    pipeline = variants(small)[name]
    count = step_count(pipeline)
    assert (count.steps, count.batches, count.left) == oracle(pipeline)
    assert count.counted == (name != "rows are samples")  # the curriculum alone knows it when rows are samples


def test_repr_and_explain_show_the_count_once_known(small):
    pipeline = variants(small)["rows are samples"]
    known = step_count(pipeline, compute=False)
    assert known is not None and f"{known.steps} global steps" in repr(pipeline)
    assert "exact from the curriculum" in str(pipeline.explain().section("this DP group").text())

    packed = variants(small)["best_fit"].options(flush_every_k_chunks=1)  # other data: not counted yet
    assert step_count(packed, compute=False) is None
    assert "pipeline.num_steps() counts them" in repr(packed)
    steps = packed.num_steps()
    assert f"{steps} global steps" in repr(packed) and f"{steps} global steps" in str(packed.explain())


def test_an_endless_stream_has_no_step_count(small):
    source = z.MixtureWorkSource([small], chunk_size=5, exhausted_policy="repeat")
    pipeline = z.Pipeline(source).tokenize().batch(2).options(canonical_replicas=2)
    with pytest.raises(EndlessStreamError):
        pipeline.num_steps()
    assert "steps        endless" in repr(pipeline)
    assert dict(pipeline.explain().section("this DP group").pairs)["steps in a pass"] == "endless"


def test_len_stays_a_typed_error_and_names_num_steps():
    """A Trainer asks len() of a map-style dataset before indexing it: a finite pipeline too must
    refuse (see test_integrations_hf), and the message says where the step count is."""
    pipeline = z.Pipeline.from_config(RECIPE)
    with pytest.raises(UnsizedPipelineError, match=r"pipeline\.num_steps\(\)") as info:
        len(pipeline)
    assert isinstance(info.value, TypeError)


def test_cli_explain_counts_the_steps_when_asked():
    """In a process of its own: the count is cached per process once made."""
    def explain(*extra):
        done = subprocess.run([sys.executable, "-m", "zephon_dask.cli", "explain", str(RECIPE), *extra],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "steps in a pass   finite; pipeline.num_steps() counts them" in explain()
    assert "steps in a pass   53 global steps (213 batches; 1 dropped after the last whole step), counted" \
        in explain("--count-steps")
