"""accelerate fed by a pipeline, and the refusal of every wrapper that would re-shard it."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

from tests.helpers.frameworks import SAVE_AT, STEPS, accelerate_run, hf_pipeline  # noqa: E402
from tests.integrations.test_integrations_hf import stream  # noqa: E402
from zephon_dask.errors import ShardingError, ZephonError  # noqa: E402


def test_save_and_load_state_resume_exactly(corpus_dir, tmp_path):
    full, resumed = accelerate_run(lambda: hf_pipeline(corpus_dir), tmp_path / "state")
    assert full == stream(corpus_dir, STEPS)
    assert resumed == full[SAVE_AT:]


def test_prepared_loader_is_passed_through_on_the_device(corpus_dir):
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import AcceleratorLoader, prepare_pipeline

    accelerator = Accelerator(cpu=True)
    with hf_pipeline(corpus_dir) as pipe:
        loader = prepare_pipeline(accelerator, pipe)
        assert isinstance(loader, AcceleratorLoader) and accelerator.prepare(loader) is loader
        batch = next(iter(loader))
        assert batch["input_ids"].device == accelerator.device and batch["input_ids"].shape[0] == 2


def refused(make):
    with pytest.raises(ShardingError, match="zephon_dask.integrations") as info:
        make()
    assert isinstance(info.value, ZephonError) and isinstance(info.value, RuntimeError)
    return str(info.value)


def test_every_resharding_wrapper_is_refused(corpus_dir):
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.data_loader import IterableDatasetShard, prepare_data_loader
    from transformers.trainer_pt_utils import IterableDatasetShard as HFShard

    with hf_pipeline(corpus_dir) as pipe:
        assert "DataLoaderDispatcher" in refused(lambda: next(iter(Accelerator(cpu=True).prepare(
            pipe.to_torch_loader()))))
        config = DataLoaderConfiguration(dispatch_batches=False)
        assert "DataLoaderShard" in refused(lambda: next(iter(Accelerator(cpu=True, dataloader_config=config)
                                                              .prepare(pipe.to_torch_loader()))))
        for workers in (0, 2):  # refused in the main process, before any worker starts
            assert "DataLoaderDispatcher" in refused(lambda w=workers: next(iter(Accelerator(cpu=True).prepare(
                pipe.to_torch_loader(num_workers=w)))))
            sharded = prepare_data_loader(pipe.to_torch_loader(num_workers=workers), num_processes=2,
                                          process_index=1, dispatch_batches=False)  # what 2 ranks get
            assert "IterableDatasetShard" in refused(lambda s=sharded: next(iter(s)))  # not a raw TypeError
        for shard in (IterableDatasetShard, HFShard):
            wrapped = shard(pipe.to_torch_dataset(), batch_size=1, num_processes=2, process_index=1)
            assert "IterableDatasetShard" in refused(lambda w=wrapped: next(iter(w)))
        sampler = torch.utils.data.distributed.DistributedSampler(range(4), num_replicas=2, rank=0)
        with pytest.raises(ValueError, match="sampler"):  # torch itself: no sampler on an IterableDataset
            torch.utils.data.DataLoader(pipe.to_torch_dataset(), sampler=sampler, batch_size=None)


def test_evaluation_loader_repeats_its_stream_and_leaves_training_exact(corpus_dir, tmp_path):
    """An evaluation every 4 steps over an evaluation pipeline: the same first 3 batches each time,
    the training stream undisturbed, and a resume from step 6 exact."""
    import torch
    from accelerate import Accelerator

    from tests.helpers.frameworks import MODEL_FIELDS, record_inputs, tiny_gpt2
    from zephon_dask.integrations.accelerate import prepare_pipeline

    def run(steps, load=None):
        accelerator = Accelerator(cpu=True)
        model = tiny_gpt2()
        seen, evaluations = record_inputs(model), []
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        with hf_pipeline(corpus_dir) as pipe, hf_pipeline(corpus_dir, seed=9) as held_out:
            loader = prepare_pipeline(accelerator, pipe)
            evaluation = prepare_pipeline(accelerator, held_out, evaluation=True)
            if load is not None:
                accelerator.load_state(load)
            first = STEPS - steps
            for step, batch in zip(range(first, STEPS), loader, strict=False):
                accelerator.backward(model(**{k: batch[k] for k in MODEL_FIELDS}).loss)
                optimizer.step()
                optimizer.zero_grad()
                if step + 1 == SAVE_AT and load is None:
                    accelerator.save_state(str(tmp_path / "state"))
                if (step + 1) % 4 == 0:
                    model.eval()
                    with torch.no_grad():
                        evaluations.append([(int(b["lane"]), int(b["index_in_lane"]))
                                            for b, _ in zip(evaluation, range(3), strict=False)])
                    model.train()
        return seen, evaluations

    full, evaluations = run(STEPS)
    assert full == stream(corpus_dir, STEPS)
    assert evaluations == [[(0, 0), (1, 0), (2, 0)]] * (STEPS // 4)
    resumed, evaluations = run(STEPS - SAVE_AT, load=str(tmp_path / "state"))
    assert resumed == full[SAVE_AT:]
    assert evaluations == [[(0, 0), (1, 0), (2, 0)]] * 2  # after steps 8 and 12
