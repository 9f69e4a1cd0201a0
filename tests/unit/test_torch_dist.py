"""``torch_dist.initialized``: the one check whether the user started ``torch.distributed``, read by
the DP identity, the rank vote on a preemption, the state gathering and the integrations."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import zephon_dask as z
from zephon_dask import torch_dist
from zephon_dask.errors import StateError


def _pipeline():
    ws = z.MixtureWorkSource([z.Dataset.from_records("d", [f"doc {i}" for i in range(8)])], chunk_size=1)
    return z.Pipeline(ws).tokenize("bytes").batch(1).options(runner="synchronous", canonical_replicas=2)


def test_one_rank_is_initialised_but_not_several(tmp_path):
    assert torch_dist.initialized() is None and torch_dist.initialized(several=True) is None
    with pytest.raises(StateError, match="needs torch.distributed initialised"):
        z.gather_state(_pipeline())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert torch_dist.initialized() is dist and torch_dist.initialized(several=True) is None
        pipe = _pipeline()
        assert pipe.session.identity() == (1, 0)  # the world's size and rank
        with pipe:
            next(iter(pipe))
            assert z.gather_state(pipe) == pipe.state_dict()
    finally:
        dist.destroy_process_group()
    assert torch_dist.initialized() is None
