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
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..curriculum.routing import worker_lanes
from ..state.progress import resume_point


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


def to_device_iter(batches: Iterator, device=None, pin_memory: bool | None = None, depth: int = 2,
                   on_deliver=None):
    """Yield dicts of tensors with ``depth`` batches staged ahead of the consumer.

    ``on_deliver(batch)`` is called for each batch as it is handed over (not
    when it is staged), so checkpoints never count a batch still in flight.
    """
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


class PipelineDataset(IterableDataset):
    """A pipeline as a torch ``IterableDataset``.

    The group's round-robin is rotated to start at its resume lane, and
    inside ``DataLoader(num_workers=n)`` worker ``i`` serves
    ``worker_lanes(rotated, n)[i]`` (DESIGN 4.7), so the DataLoader's
    in-order polling of its workers (which always starts at worker 0)
    replays the pipeline's strict round-robin, also after a resume with
    another worker count. Each item is a dict of tensors plus ``lane``,
    ``index_in_lane``, ``position`` (the lane's frontier after the batch) and
    ``last``. With the distributed runner the cluster is started here, in
    the parent, and the workers connect to it by address.
    """

    def __init__(self, pipeline):
        self.pipeline = pipeline
        runner = pipeline.runner()
        self._worker_pipeline = copy.copy(pipeline)  # copies drop the runner (Pipeline.__getstate__)
        self._worker_pipeline._runner = self._worker_pipeline._stream = None
        self._worker_pipeline._progress = None
        self._worker_pipeline._options = dict(pipeline._options)
        client = getattr(runner, "client", None)
        if client is not None:
            self._worker_pipeline._options.update(client=None, address=client.scheduler.address)

    def __iter__(self):
        info = get_worker_info()
        pipe = self.pipeline if info is None else self._worker_pipeline
        owned = pipe.owned_lanes()
        _, first = resume_point(pipe._resume, owned)
        lanes = owned[owned.index(first):] + owned[:owned.index(first)]
        if info is not None:
            lanes = worker_lanes(lanes, info.num_workers)[info.id]
        if not lanes:
            return
        try:
            for batch in pipe._open_stream(lanes, lanes[0]):
                out = batch_to_torch(batch)
                out["lane"] = torch.tensor(batch.lane)
                out["index_in_lane"] = torch.tensor(batch.index_in_lane)
                out["position"] = torch.tensor(batch.position)
                out["last"] = torch.tensor(batch.last)
                out["dataset_tokens"] = torch.from_numpy(batch.dataset_tokens())
                yield out
        finally:
            if pipe is not self.pipeline:
                pipe.close()


class PipelineLoader:
    """``DataLoader(PipelineDataset(pipeline), batch_size=None, ...)`` that reports deliveries.

    Each batch the loop receives is recorded in the pipeline's progress (and
    ledger), so ``pipeline.state_dict()`` is exact however far the
    DataLoader's workers have prefetched.
    """

    def __init__(self, pipeline, num_workers: int = 0, **dataloader_kwargs):
        self.pipeline, self.num_workers, self.kwargs = pipeline, num_workers, dataloader_kwargs

    def __iter__(self):
        progress = self.pipeline._begin()
        loader = DataLoader(PipelineDataset(self.pipeline), batch_size=None,
                            num_workers=self.num_workers, **self.kwargs)
        for out in loader:
            window, offset = (int(v) for v in out["position"])
            progress.observe(int(out["lane"]), int(out["index_in_lane"]), window, offset,
                             bool(out["last"]), out["tokens"].numpy(), out["dataset_tokens"].numpy())
            yield out
