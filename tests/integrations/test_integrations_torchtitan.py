"""TorchTitan: launched with ``torchtitan.train``'s arguments and configured through its
``ConfigManager``, the ``ZephonDataLoader`` saved by TorchTitan's ``CheckpointManager`` (DCP) at dp=2
resumes at dp=4 (``torchrun``, gloo, CPU) and dp=1 with the same global steps as the uninterrupted
run; its configuration errors, its state's one key and its RNG neutrality in process."""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torchtitan")

import torch  # noqa: E402

from tests.helpers.frameworks import digest  # noqa: E402
from tests.integrations.test_torchrun import torchrun  # noqa: E402
from tests.jobs import torchtitan_job  # noqa: E402
from tests.jobs.torchtitan_job import CORPUS_ENV, SEQ_LEN, titan_pipeline, write_tokenizer  # noqa: E402
from zephon_dask.errors import ConfigError, StateError  # noqa: E402
from zephon_dask.integrations.torchtitan import STATE_KEY, ZephonDataLoader, configure  # noqa: E402
from zephon_dask.pipeline import Pipeline  # noqa: E402

STEPS, SAVE_AT, G = 6, 3, 4  # G: the pipeline's global step (canonical_replicas=4 batches)
RECIPE = Path(__file__).resolve().parents[2] / "examples" / "recipe.toml"
EXAMPLE = RECIPE.parent / "frameworks" / "torchtitan_loop.py"
JOB = Path(torchtitan_job.__file__).name


def build_loader(pipeline, world=1, rank=0, seq_len=SEQ_LEN, local_batch_size=2) -> ZephonDataLoader:
    """The loader as TorchTitan's trainer builds it from its config."""
    return ZephonDataLoader.Config(pipeline=pipeline).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=seq_len, local_batch_size=local_batch_size,
        snapshot_every_n_steps=None)


def steps_of(out: Path, world: int) -> dict[int, list[str]]:
    """Per optimizer step, what all ranks trained on together (a sorted list of micro-batch digests)."""
    steps: dict[int, list[str]] = {}
    for rank in range(world):
        result = json.loads((out / f"rank-{rank}.json").read_text())
        assert result["world"] == world
        for step, trained in result["steps"].items():
            assert len(trained) == G // world  # the trainer's gradient accumulation: G / dp micro-batches
            steps.setdefault(int(step), []).extend(trained)
    return {step: sorted(trained) for step, trained in steps.items()}


@pytest.fixture(scope="module")
def uninterrupted(corpus_dir) -> dict[int, list[str]]:
    """The reference: the dp=1 stream in one process, no checkpoint, G batches a step."""
    with titan_pipeline(corpus_dir) as pipeline:
        batches = iter(build_loader(pipeline))
        steps = {}
        for step in range(1, STEPS + 1):
            trained = []
            for _ in range(G):
                inputs, labels = next(batches)
                trained.append(digest(inputs["input"]) + digest(labels) + digest(inputs["positions"]))
            steps[step] = sorted(trained)
    return steps


def titan_args(dump_folder: Path, tokenizer: Path, *overrides: str) -> list[str]:
    """``torchtitan.train``'s command line for the job's config function."""
    return ["--module", "tests.jobs.torchtitan_job", "--config", "titan_config", "--hf_assets_path",
            str(tokenizer), "--dump_folder", str(dump_folder), *overrides]


@pytest.mark.slow
def test_checkpoint_at_dp2_resumes_at_dp1_and_dp4_with_the_same_global_steps(corpus_dir, tmp_path, monkeypatch,
                                                                             uninterrupted):
    monkeypatch.setenv(CORPUS_ENV, str(corpus_dir))  # torchrun's ranks inherit it
    tokenizer = write_tokenizer(tmp_path / "tokenizer")
    overrides = ["--training.steps", str(STEPS), "--checkpoint.interval", str(SAVE_AT)]
    torchrun(2, *titan_args(tmp_path / "dp2", tokenizer, *overrides), job=JOB, timeout=300)
    assert steps_of(tmp_path / "dp2", 2) == uninterrupted
    saved = tmp_path / "dp2" / "checkpoint" / f"step-{SAVE_AT}"
    assert (saved / ".metadata").is_file()  # written by DCP
    for world in (1, 4):
        out = tmp_path / f"dp{world}"
        shutil.copytree(saved, out / "checkpoint" / saved.name)  # the run's latest checkpoint: the trainer loads it
        if world == 1:
            torchtitan_job.main(titan_args(out, tokenizer, *overrides))  # one process: DP degree 1
        else:
            torchrun(world, *titan_args(out, tokenizer, *overrides), job=JOB, timeout=300)
        resumed = steps_of(out, world)
        assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))  # the train state resumed too
        assert resumed == {step: uninterrupted[step] for step in resumed}


def test_titans_config_manager_reads_a_config_function_that_sets_the_pipeline(corpus_dir, monkeypatch):
    from torchtitan.config.manager import ConfigManager

    monkeypatch.setenv(CORPUS_ENV, str(corpus_dir))
    config = ConfigManager().parse_args(["--module", "tests.jobs.torchtitan_job", "--config", "titan_config",
                                         "--training.steps", "9", "--dataloader.num_workers", "1"])
    assert isinstance(config.dataloader, ZephonDataLoader.Config) and isinstance(config.dataloader.pipeline, Pipeline)
    assert (config.training.steps, config.dataloader.num_workers) == (9, 1)
    assert (config.training.local_batch_size, config.training.global_batch_size) == (2, 2 * G)
    assert config.dataloader.pipeline.fingerprint() == titan_pipeline(corpus_dir).fingerprint()


def test_batches_are_titans_shape_padded_to_seq_len(corpus_dir):
    with titan_pipeline(corpus_dir) as pipeline:
        inputs, labels = next(iter(build_loader(pipeline)))
    with titan_pipeline(corpus_dir) as pipeline:
        reference = next(iter(pipeline))
    assert sorted(inputs) == ["input", "positions"]
    width = reference["tokens"].shape[1]
    for tensor in (inputs["input"], inputs["positions"], labels):
        assert tensor.shape == (2, SEQ_LEN) and tensor.dtype == torch.int64
    assert inputs["input"][:, :width].tolist() == reference["tokens"].tolist()
    assert labels[:, :width].tolist() == reference["labels"].tolist()
    assert inputs["positions"][:, :width].tolist() == reference["positions"].tolist()
    assert (labels[:, width:] == -100).all() and (inputs["positions"][:, width:] == 0).all()


def test_state_is_one_json_key_and_loading_it_resumes(corpus_dir):
    with titan_pipeline(corpus_dir) as pipeline:
        loader = build_loader(pipeline)
        batches = iter(loader)
        for _ in range(G):
            next(batches)
        saved = loader.state_dict()
        expected = next(batches)
    assert list(saved) == [STATE_KEY] and isinstance(saved[STATE_KEY], str)
    assert json.loads(saved[STATE_KEY])["step"]["global_step"] == 1
    with titan_pipeline(corpus_dir) as pipeline:
        loader = build_loader(pipeline)
        loader.load_state_dict(saved)
        resumed = next(iter(loader))
    assert all(torch.equal(a, b) for a, b in zip(expected[0].values(), resumed[0].values()))
    assert torch.equal(expected[1], resumed[1])


def test_iterating_draws_nothing_from_the_global_rng(corpus_dir):
    with titan_pipeline(corpus_dir) as pipeline:
        loader = build_loader(pipeline)
        before = torch.get_rng_state()
        next(iter(loader))
        assert torch.equal(before, torch.get_rng_state())


def test_a_state_inside_a_global_step_names_the_batch_size(corpus_dir):
    with titan_pipeline(corpus_dir) as pipeline:
        loader = build_loader(pipeline)
        next(iter(loader))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the pipeline's own mid-step warning
            with pytest.raises(ConfigError, match=r"global_batch_size to a multiple of 8"):
                loader.state_dict()


def test_a_state_of_another_loader_is_refused(corpus_dir):
    with titan_pipeline(corpus_dir) as pipeline:
        loader = build_loader(pipeline)
        loader.load_state_dict({})  # TorchTitan: an empty state starts afresh
        with pytest.raises(StateError, match=r"dp_rank_0.*exclude_from_loading"):
            loader.load_state_dict({"dp_rank_0": b"", "world_size": 2})  # TorchTitan's own loader's


@pytest.mark.parametrize(("change", "match"), [
    ({"labels": "hf"}, r"labels=True"),
    ({"local_batch_size": 4}, r"local_batch_size.*\.batch\(2\)"),
    ({"seq_len": 64}, r"\.pack\(96\).*seq_len is 64"),
])
def test_config_errors_name_the_fix(corpus_dir, change, match):
    pipeline = titan_pipeline(corpus_dir, labels=change.pop("labels", True))
    with pytest.raises(ConfigError, match=match):
        build_loader(pipeline, **change)


def test_the_config_takes_a_recipe_or_a_pipeline(corpus_dir):
    with pytest.raises(ConfigError, match="needs pipeline="):
        ZephonDataLoader.Config().build(dp_world_size=1, dp_rank=0, seq_len=SEQ_LEN, local_batch_size=2)
    with pytest.raises(ConfigError, match="give one"):
        ZephonDataLoader.Config(pipeline=titan_pipeline(corpus_dir), recipe=str(RECIPE)).build(
            dp_world_size=1, dp_rank=0, seq_len=SEQ_LEN, local_batch_size=2)
    loader = ZephonDataLoader.Config(recipe=str(RECIPE)).build(dp_world_size=2, dp_rank=1, seq_len=512,
                                                               local_batch_size=4)
    assert loader.pipeline.session.identity() == (2, 1) and loader.pipeline.description.batch.microbatch_size == 4
    loader.close()  # the loader made this pipeline, so it closes it


def test_configure_sets_one_global_step_per_optimizer_step(corpus_dir):
    from torchtitan.config import ParallelismConfig, TrainingConfig

    config = SimpleNamespace(training=TrainingConfig(), parallelism=ParallelismConfig(), dataloader=None)
    pipeline = titan_pipeline(corpus_dir).options(global_batches_per_step=8)
    configure(config, pipeline)
    assert (config.training.local_batch_size, config.training.global_batch_size) == (2, 16)
    assert config.dataloader.pipeline is pipeline
    with pytest.raises(ConfigError, match="global_batches_per_step=G"):
        configure(config, titan_pipeline(corpus_dir).options(batches_per_step=4))


def test_titans_command_line_sets_the_recipe_and_leaves_the_pipeline_out():
    import tyro
    from torchtitan.config.manager import custom_registry

    default = ZephonDataLoader.Config(recipe="a.toml")
    parsed = tyro.cli(ZephonDataLoader.Config, args=["--recipe", "b.toml", "--num_workers", "2"], default=default,
                      registry=custom_registry)
    assert (parsed.recipe, parsed.num_workers, parsed.pipeline) == ("b.toml", 2, None)
    with pytest.raises(SystemExit):
        tyro.cli(ZephonDataLoader.Config, args=["--pipeline", "x"], default=default, registry=custom_registry)


def test_example_trains_checkpoints_and_resumes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("example_torchtitan_loop", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    common = ["--save-every", "1", "--runner", "synchronous"]
    example.main(["--steps", "1", "--out", str(tmp_path / "a"), *common])
    example.main(["--steps", "2", "--out", str(tmp_path / "b"), "--resume",
                  str(tmp_path / "a" / "checkpoint" / "step-1"), *common])
    assert (tmp_path / "b" / "checkpoint" / "step-2" / ".metadata").is_file()
    out = capsys.readouterr().out
    assert out.count("step 1:") == 1 and "step 2:" in out  # the second run started after step 1
