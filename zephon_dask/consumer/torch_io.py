"""Numpy batches -> torch tensors, and device copies ahead of the loop. Holds no state.

One of the few modules that imports torch. ``to_device_iter`` keeps ``depth``
batches staged ahead: on CUDA each is pinned, copied on a side stream, and the
consuming stream waits on an event before the tensors are used (and records
them, so the caching allocator never reuses their memory early). Elsewhere
the same queue runs with plain conversions. The DataLoader adapters over a
pipeline are in :mod:`zephon_dask.pipeline.torch_data`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch

from ..errors import DeviceUnavailableError


def check_device(device, call: str = "to_torch") -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``), or a
    :class:`~zephon_dask.errors.DeviceUnavailableError` when it is a device this torch cannot use
    (CUDA: built without it, no GPU visible, or an index past the GPUs present; ``mps`` and the
    other accelerators: their backend says it is not available)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "mps":
        usable = torch.backends.mps.is_available()
    else:  # xpu, mtia, ...: a backend module with is_available(); cpu and meta have none
        usable = getattr(getattr(torch, device.type, None), "is_available", lambda: True)()
    if device.type != "cuda" and not usable:
        raise DeviceUnavailableError(
            f"{call}(device={str(device)!r}): torch {torch.__version__} cannot use {device.type!r} on "
            "this machine. Use device='cpu' (or leave device=None), or 'cuda' where a GPU is present")
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None else
               f"this torch is built with CUDA {torch.version.cuda} but sees no GPU")
        raise DeviceUnavailableError(
            f"{call}(device={str(device)!r}): CUDA is not available ({why}; torch {torch.__version__}). "
            "Use device='cpu' (or leave device=None) with pin_memory=False, or install a CUDA build "
            "of torch on a machine with a GPU")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"{call}(device={str(device)!r}): this machine has {torch.cuda.device_count()} GPU(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}; pass one of them (e.g. the local rank's)")
    return device


def batch_to_torch(batch, device=None, non_blocking: bool = False, pin_memory: bool = False) -> dict:
    """Tensors sharing the batch's numpy memory (pinned / moved when asked)."""
    device = check_device(device, "Batch.to_torch")
    out = {}
    pin = pin_memory and torch.cuda.is_available()
    for key, value in batch.items():
        t = torch.from_numpy(value)
        if pin:
            t = t.pin_memory()
        if device is not None:
            t = t.to(device, non_blocking=non_blocking and pin)
        out[key] = t
    return out


class _CudaStager:
    """Pins a batch and copies it to the GPU on a side stream; hands it over after an event."""

    def __init__(self, device: torch.device, pin: bool):
        self.device, self.pin = device, pin
        self.stream = torch.cuda.Stream(device=device)

    def stage(self, batch):
        host = batch_to_torch(batch, pin_memory=self.pin)
        with torch.cuda.stream(self.stream):
            moved = {k: v.to(self.device, non_blocking=self.pin) for k, v in host.items()}
            event = torch.cuda.Event()
            event.record(self.stream)
        return moved, event

    def finish(self, staged) -> dict:
        moved, event = staged
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in moved.values():
            t.record_stream(current)
        return moved


class _HostStager:
    def __init__(self, device, pin: bool):
        self.device, self.pin = device, pin

    def stage(self, batch):
        return batch_to_torch(batch, device=self.device, pin_memory=self.pin)

    def finish(self, staged) -> dict:
        return staged


def to_device_iter(batches: Iterator, device=None, pin_memory: bool | None = None, depth: int = 2,
                   on_deliver=None):
    """Yield dicts of tensors with ``depth`` batches staged ahead of the consumer.

    ``on_deliver(batch)`` is called for each batch as it is handed over (not
    when it is staged), so checkpoints never count a batch still in flight.
    """
    device = check_device(device)
    cuda = device is not None and device.type == "cuda"
    pin = (cuda if pin_memory is None else bool(pin_memory)) and torch.cuda.is_available()
    stager = _CudaStager(device, pin) if cuda else _HostStager(device, pin)
    staged: deque = deque()
    it = iter(batches)
    exhausted = False
    while True:
        while not exhausted and len(staged) < max(1, depth):
            try:
                batch = next(it)
            except StopIteration:
                exhausted = True
            else:
                staged.append((batch, stager.stage(batch)))
        if not staged:
            return
        batch, ready = staged.popleft()
        out = stager.finish(ready)
        if on_deliver is not None:
            on_deliver(batch)
        yield out


def batch_item(batch) -> dict:
    """A batch as the DataLoader yields it: its tensors plus ``lane``, ``index_in_lane``,
    ``position`` (the lane's frontier after it), ``last``, ``dataset_tokens`` and ``dataset_samples``."""
    out = batch_to_torch(batch)
    out["lane"] = torch.tensor(batch.lane)
    out["index_in_lane"] = torch.tensor(batch.index_in_lane)
    out["position"] = torch.tensor(batch.position)
    out["last"] = torch.tensor(batch.last)
    out["dataset_tokens"] = torch.from_numpy(batch.dataset_tokens())
    out["dataset_samples"] = torch.from_numpy(batch.dataset_samples())
    return out
