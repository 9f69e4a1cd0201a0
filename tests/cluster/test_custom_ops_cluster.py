"""A user's operators (``add_op``) travel to Dask worker processes pickled, as ``validate()``
checks they can, and give there the batches of the built-ins they stand for."""

from __future__ import annotations

import itertools

import pytest

from tests.helpers.oracles import batch_rows, ref_group_stream
from tests.pipeline.test_custom_ops import pipeline
from zephon_dask.pipeline.ranks import owned_lanes

pytestmark = pytest.mark.timeout(300)


def test_add_op_on_worker_processes_gives_the_maps_batches(corpus_dir):
    """Cut on two worker processes, resumed in this process: the ``.map`` oracle's batches."""
    reference = pipeline(corpus_dir, False)
    truth = ref_group_stream(reference.spec, owned_lanes(reference.description.settings), 3)
    with pipeline(corpus_dir, True, runner="distributed", n_workers=2) as pipe:
        got = [batch_rows(b) for b in itertools.islice(pipe, 30)]
        workers = set(pipe.session.runner().worker_pids().values())
        state = pipe.state_dict()
    resumed = pipeline(corpus_dir, True, runner="synchronous").load_state_dict(state)
    with resumed:
        got += [batch_rows(b) for b in resumed]
    assert got == truth
    assert len(workers) == 2
