"""Numpy batches -> torch tensors, device copies ahead of the loop, DataLoader integration.

One of the few modules that imports torch. ``to_device_iter`` keeps ``depth``
batches staged ahead: on CUDA each is pinned, copied on a side stream, and the
consuming stream waits on an event before the tensors are used (and records
them, so the caching allocator never reuses their memory early). Elsewhere
the same queue runs with plain conversions.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..curriculum.routing import worker_lanes


def batch_to_torch(batch, device=None, non_blocking: bool = False, pin_memory: bool = False) -> dict:
    """Tensors sharing the batch's numpy memory (pinned / moved when asked)."""
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


def to_device_iter(batches: Iterator, device=None, pin_memory: bool | None = None, depth: int = 2):
    """Yield dicts of tensors with ``depth`` batches staged ahead of the consumer."""
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    pin = (cuda if pin_memory is None else bool(pin_memory)) and torch.cuda.is_available()
    stager = _CudaStager(device, pin) if cuda else _HostStager(device, pin)
    staged: deque = deque()
    it = iter(batches)
    exhausted = False
    while True:
        while not exhausted and len(staged) < max(1, depth):
            try:
                staged.append(stager.stage(next(it)))
            except StopIteration:
                exhausted = True
        if not staged:
            return
        yield stager.finish(staged.popleft())


class PipelineDataset(IterableDataset):
    """A pipeline as a torch ``IterableDataset``.

    Inside ``DataLoader(num_workers=n)``, worker ``i`` serves the lanes
    ``worker_lanes(owned, n)[i]`` (DESIGN 4.7), so the DataLoader's in-order
    polling of its workers replays the pipeline's strict round-robin. With the
    distributed runner, the cluster is started here, in the parent, and the
    workers connect to it by address.
    """

    def __init__(self, pipeline):
        self.pipeline = pipeline
        runner = pipeline.runner()
        self._worker_pipeline = copy.copy(pipeline)  # copies drop the runner (Pipeline.__getstate__)
        self._worker_pipeline._runner = self._worker_pipeline._stream = None
        self._worker_pipeline._options = dict(pipeline._options)
        client = getattr(runner, "client", None)
        if client is not None:
            self._worker_pipeline._options.update(client=None, address=client.scheduler.address)

    def __iter__(self):
        info = get_worker_info()
        lanes = self.pipeline.owned_lanes()
        if info is None:
            pipe = self.pipeline
        else:
            lanes = worker_lanes(lanes, info.num_workers)[info.id]
            pipe = self._worker_pipeline
        if not lanes:
            return
        try:
            for batch in pipe._iter_lanes(lanes):
                out = batch_to_torch(batch)
                out["lane"] = torch.tensor(batch.lane)
                out["index_in_lane"] = torch.tensor(batch.index_in_lane)
                yield out
        finally:
            if pipe is not self.pipeline:
                pipe.close()
