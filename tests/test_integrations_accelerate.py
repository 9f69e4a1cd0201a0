"""accelerate fed by a pipeline, and the refusal of every wrapper that would re-shard it."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

from frameworks import SAVE_AT, STEPS, accelerate_run, hf_pipeline  # noqa: E402
from test_integrations_hf import stream  # noqa: E402

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
    from accelerate.data_loader import IterableDatasetShard
    from transformers.trainer_pt_utils import IterableDatasetShard as HFShard

    with hf_pipeline(corpus_dir) as pipe:
        assert "DataLoaderDispatcher" in refused(lambda: next(iter(Accelerator(cpu=True).prepare(
            pipe.to_torch_loader()))))
        config = DataLoaderConfiguration(dispatch_batches=False)
        assert "DataLoaderShard" in refused(lambda: next(iter(Accelerator(cpu=True, dataloader_config=config)
                                                              .prepare(pipe.to_torch_loader()))))
        for shard in (IterableDatasetShard, HFShard):
            wrapped = shard(pipe.to_torch_dataset(), batch_size=1, num_processes=2, process_index=1)
            assert "IterableDatasetShard" in refused(lambda w=wrapped: next(iter(w)))
        sampler = torch.utils.data.distributed.DistributedSampler(range(4), num_replicas=2, rank=0)
        with pytest.raises(ValueError, match="sampler"):  # torch itself: no sampler on an IterableDataset
            torch.utils.data.DataLoader(pipe.to_torch_dataset(), sampler=sampler, batch_size=None)
