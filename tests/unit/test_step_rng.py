"""The random generators at a step boundary (``zephon_dask.integrations.rng``): a captured state
restores every generator to draw the same numbers again, capturing draws nothing, the state loads
with ``weights_only=True``, and the CUDA path (faked here: no GPU needed) reads and sets each device."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_dask.integrations import rng


def draws() -> tuple:
    return torch.rand(4).tolist(), np.random.rand(3).tolist(), np.random.randn(1).tolist(), random.random()


@pytest.fixture(autouse=True)
def keep_generators():
    """Each test leaves the process's generators as it found them."""
    before = rng.capture()
    yield
    rng.restore(before)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gaussians=st.integers(0, 3))
def test_a_restored_state_draws_the_same_numbers_and_capturing_draws_nothing(seed, gaussians):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    np.random.randn(gaussians)  # an odd count leaves numpy a cached second Gaussian: it travels too
    random.gauss(0, 1) if gaussians % 2 else None  # and Python's
    state = rng.capture()
    assert rng.capture()["torch"].equal(state["torch"])  # reading drew nothing
    first = draws()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    rng.restore(torch.load(buffer, weights_only=True))  # plain builtins and tensors
    assert draws() == first


class FakeCuda:
    """torch.cuda as on a machine with CUDA in use: per-device states, and the calls that set them."""

    def __init__(self, devices: int, initialized: bool = True):
        self.devices, self.initialized = devices, initialized
        self.states = [torch.full((16,), d, dtype=torch.uint8) for d in range(devices)]
        self.set: list[tuple[int, int]] = []

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: self.set.append((int(state[0]), device)))


def test_cuda_states_are_kept_per_device_once_cuda_is_in_use(monkeypatch):
    two = FakeCuda(2)
    two.install(monkeypatch)
    state = rng.capture()
    assert [int(s[0]) for s in state["cuda"]] == [0, 1]
    rng.restore(state)
    assert two.set == [(0, 0), (1, 1)]
    one = FakeCuda(1)  # resumed where one device is visible: the others are left out
    one.install(monkeypatch)
    rng.restore(state)
    assert one.set == [(0, 0)]
    FakeCuda(2, initialized=False).install(monkeypatch)  # CUDA not started: nothing to read, nothing started
    assert "cuda" not in rng.capture()


def test_cuda_states_are_ignored_without_cuda(monkeypatch):
    FakeCuda(1).install(monkeypatch)
    state = rng.capture()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: pytest.fail("set without CUDA"))
    rng.restore(state)


def test_step_rng_restores_a_loaded_state_when_the_next_step_begins():
    torch.manual_seed(3)
    saved = rng.capture()
    step = rng.StepRNG()
    step.load(saved)
    torch.manual_seed(4)  # whatever happens before the resumed fit's first micro-batch
    assert step.at_boundary(mid_step=False) is saved  # a checkpoint before it keeps the loaded state
    step.step_begins()
    assert step.boundary["torch"].equal(saved["torch"])
    torch.rand(5)  # the step's dropout
    assert step.at_boundary(mid_step=True)["torch"].equal(saved["torch"])
    assert not step.at_boundary(mid_step=False)["torch"].equal(saved["torch"])  # at a boundary: now


def test_this_rank_takes_its_own_state_only_from_a_run_of_as_many_ranks():
    assert rng.this_rank(rng.all_ranks({"torch": 1})) == {"torch": 1}
    assert rng.this_rank([{"torch": 1}, {"torch": 2}]) is None  # written by 2 ranks, read by 1
    assert rng.this_rank(None) is None
