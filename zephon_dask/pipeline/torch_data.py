"""torch ``DataLoader`` adapters over a pipeline. Hold state: what each process served.

:class:`PipelineDataset` is an ``IterableDataset`` implementing torchdata's
``Stateful`` protocol in the process that iterates it (a DataLoader worker or
the main process); :class:`PipelineLoader` is a ``DataLoader`` whose state is
the pipeline's own. Both use only the pipeline's and its session's public
methods. Neither draws from the global random generators: a loader's
iterator takes its workers' base seed from the loader's own generator
(:func:`loader_generator`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..consumer.pass_end import KEEP_EVERY_SAMPLE, UNAGREED, StepAgreement
from ..consumer.torch_io import batch_item, check_device, to_device_iter
from ..curriculum.routing import worker_lanes
from ..curriculum.seeding import stream_keys
from ..errors import ConfigError, StateError, ZephonWarning
from ..state import dataset_state
from ..state.dataset_state import DatasetState, worker_shape
from ..state.progress import Progress, resume_point
from ..state.schema import State, config_diff, describe_diff
from . import resume
from .guard import refuse_fetching_ahead, refuse_resharding
from .ranks import owned_lanes


def device_batches(pipeline, device=None, pin_memory: bool | None = None, prefetch: int = 2) -> Iterator[dict]:
    """``pipeline.to_torch(...)``: an iteration of the pipeline's session whose batches are dicts
    of tensors, staged on ``device`` ``prefetch`` ahead; a delivery moves the pipeline's state."""
    device = check_device(device)  # here, not at the first batch
    session = pipeline.session

    def staged(progress):
        return to_device_iter(session.tracked_stream(progress), device=device, pin_memory=pin_memory,
                              depth=prefetch, on_deliver=progress.observe_batch)

    return session.iterate(staged, observe=False)


def handed_dataset(pipeline) -> PipelineDataset:
    """``pipeline.to_torch_dataset()``: a :class:`PipelineDataset` starting where the pipeline's
    next iteration would; the pipeline's own state then raises until it iterates again."""
    session = pipeline.session
    if session.pending:
        raise StateError(
            "a state was loaded into this pipeline for its next iteration, but a DataLoader's workers "
            "copy a to_torch_dataset() afresh at every iteration and would start each one there. "
            "Iterate pipeline.to_torch_loader() (a DataLoader whose state is the pipeline's), or "
            "resume a StatefulDataLoader from its own state_dict() with loader.load_state_dict()")
    _ = pipeline.spec.source  # weight_by="tokens": measured here once, not in every worker
    dataset = PipelineDataset(pipeline, start=session.next_start(owned_lanes(pipeline.description.settings)))
    session.hand_out()
    return dataset


class PipelineDataset(IterableDataset):
    """A pipeline as a torch ``IterableDataset``, ``Stateful`` for torchdata's ``StatefulDataLoader``.

    The group's round-robin is rotated to start at its resume lane, and
    inside ``DataLoader(num_workers=n)`` worker ``i`` serves
    ``worker_lanes(rotated, n)[i]`` (see ``docs/distributed.md``, DataLoader workers), so the DataLoader's
    in-order polling of its workers (which always starts at worker 0)
    replays the pipeline's strict round-robin, also after a resume with
    another worker count. With the distributed runner the cluster is started
    here, in the parent, and the workers connect to it by address.

    Holds state per process: the lanes it serves and their progress.
    :meth:`state_dict` (called by torchdata in the worker after each batch)
    is that progress, a pipeline state of the served lanes, wrapped with the
    worker's identity; its step is the group's (G, degree and microbatch size,
    kept by a resume; ``batches_per_step`` is this worker's share of a step).
    :meth:`load_state_dict` (called in the worker before iterating) makes the
    next iteration start there, recomputing one window per lane (O(1) in the
    position).

    Where an iteration starts: at a loaded state, once; else, the first in a
    process at the dataset's start (``start``, or :meth:`begin_at`'s), and
    each later one at a new pass over the stream after the last. A
    DataLoader's workers are fresh copies of the dataset at every iteration of
    the loader, so there each iteration without a loaded state starts at the
    dataset's start.
    """

    follows_training_step = False  # True: inside a loader whose state is the trained batches' (see guard)

    def __init__(self, pipeline, start: State | None = None):
        check_stateful_loads()
        pipeline.session.step_shape()  # its state records the step: bad step settings are refused here, not in a worker
        self.pipeline = pipeline
        runner = pipeline.session.runner()
        client = getattr(runner, "client", None)
        self._address = client.scheduler.address if client is not None else None
        self._identity = pipeline.session.identity()
        self._worker_pipe = None  # in a worker: a copy of the pipeline without the parent's runner
        self._first = start  # where the first iteration in a process starts (None: the stream's beginning)
        self._loaded: tuple[list[int], State | None] | None = None  # lanes and state given to load_state_dict,
        # for the next iteration only
        self._progress: Progress | None = None  # this process's current (or last) iteration

    def begin_at(self, start: State | None) -> None:
        """The next iteration here, and in every DataLoader worker started after this call,
        starts at ``start`` (a checked state of the group's lanes; ``None``: the stream's beginning)."""
        self._first, self._loaded, self._progress = start, None, None

    def _pipe(self):
        """The pipeline to stream from in this process."""
        if get_worker_info() is None:
            return self.pipeline
        if self._worker_pipe is None:
            remote = {} if self._address is None else {"client": None, "address": self._address}
            # a new pipeline (its own session, no runner of the parent's), the parent's resume point
            pipe = self.pipeline.options(dp_degree=self._identity[0], dp_group_id=self._identity[1], **remote)
            if self.pipeline.session.evaluation:
                pipe.session.serve_evaluation()
            self._worker_pipe = pipe
        return self._worker_pipe

    @staticmethod
    def _worker() -> tuple[int, int]:
        info = get_worker_info()
        return (0, 0) if info is None else (info.id, info.num_workers)

    def _serving(self) -> tuple[list[int], State | None, int | None]:
        """The lanes served here in round-robin order, the state they start at, the first lane."""
        if self._loaded is not None:
            return list(self._loaded[0]), self._loaded[1], None
        pipe = self._pipe()
        owned = owned_lanes(pipe.description.settings)
        start = self._progress.next_pass() if self._progress is not None else self._first
        _, first = resume_point(start, owned)
        lanes = owned[owned.index(first):] + owned[:owned.index(first)]
        worker, workers = self._worker()
        if workers:
            lanes = worker_lanes(lanes, workers)[worker]
        return lanes, start, lanes[0] if lanes else None

    def _begin(self) -> tuple[Progress | None, State | None]:
        """This process's progress (``None`` for a worker serving no lane) and its start state."""
        lanes, start, first = self._serving()
        if not lanes:
            return None, None
        pipe = self._pipe()
        group = resume.shape_for(pipe.description, start, pipe.session.identity()[0])  # a loaded state's G, kept
        shape = worker_shape(group, lanes, len(owned_lanes(pipe.description.settings)))
        return Progress(pipe.spec, lanes, start, shape, first_lane=first), start

    def __iter__(self):
        refuse_resharding()  # a framework wrapper splitting these rank-split lanes again
        if not self.follows_training_step and (refused := refuse_fetching_ahead(
                "a pipeline's to_torch_dataset()")) is not None:
            return refused  # Lightning would checkpoint it a batch ahead of the step
        progress, resume = self._begin()
        if progress is not None:  # a worker serving no lane keeps its start
            self._progress, self._loaded = progress, None
        return self._generate(self._pipe(), progress, resume)

    def set_epoch(self, epoch: int) -> None:
        """Nothing to set (where each lane stands is the state); a wrapper that re-shards calls it
        before iterating, so it is refused here, in the main process, also with DataLoader workers."""
        refuse_resharding()

    @staticmethod
    def _generate(pipe, progress: Progress | None, start: State | None):
        if progress is None:
            return
        stream = pipe.session.open_stream(progress.lanes, start, progress.first_lane, progress.shape)
        stream.on_finish = progress.lane_finished
        if get_worker_info() is None:  # the process serving training (a worker's loader votes for it)
            pipe.session.open_voting(stream, progress)
        try:
            for batch in stream:
                progress.observe_batch(batch)  # before the yield: torchdata snapshots right after it
                yield batch_item(batch)
        finally:
            stream.close()

    @staticmethod
    def check_loader_state(state: dict, num_workers: int) -> None:
        """Refuse a ``StatefulDataLoader`` state that a loader with ``num_workers`` cannot load.

        torchdata resumes only with the worker count a state was taken with,
        and between 0 and more workers it fails with a bare ``AssertionError``
        before this dataset sees the state. ``StatefulDataLoader.load_state_dict``
        calls this for a loader over a pipeline dataset (:func:`check_stateful_loads`).

        Args:
            state: a ``StatefulDataLoader.state_dict()`` over a pipeline dataset.
            num_workers: the resuming loader's ``num_workers``.

        Raises:
            StateError: ``state`` holds no pipeline dataset state, or was taken
                with another ``num_workers`` (the message names the fix).

        Example:
            >>> loader.dataset.check_loader_state(state, loader.num_workers)  # doctest: +SKIP
        """
        taken = sorted({ds.get("num_workers") for ds in dataset_state.dataset_states(state)}, key=repr)
        if not taken:
            raise StateError("the state holds no zephon_dask dataset state: pass the state_dict() of a "
                             "StatefulDataLoader over pipeline.to_torch_dataset()")
        if taken != [num_workers]:
            raise StateError(worker_count_error(taken[0] if len(taken) == 1 else taken, num_workers))

    def state_dict(self) -> dict:
        """Where this process's iteration stands: plain builtins (torchdata's ``Stateful``; the
        schema is :mod:`zephon_dask.state.dataset_state`)."""
        progress = self._progress if self._progress is not None else self._begin()[0]
        worker, workers = self._worker()
        return dataset_state.to_dict(worker, workers, list(progress.lanes) if progress else [],
                                     progress.state() if progress else None)

    def load_state_dict(self, state: dict) -> None:
        """Start the next iteration in this process where ``state`` (from :meth:`state_dict`) stands."""
        read = DatasetState.from_dict(state)
        worker, workers = self._worker()
        if (read.worker, read.num_workers) != (worker, workers):
            raise StateError(worker_count_error(read.num_workers, workers))
        if read.state is None:  # a worker that serves no lane
            self._loaded, self._progress = ([], None), None
            return
        pipe = self._pipe()
        owned = set(owned_lanes(pipe.description.settings))
        lanes = _served(read.lanes, read.state, owned)
        inner = read.migrated(lambda: worker_shape(pipe.session.step_shape(), lanes, len(owned))).state
        assert inner is not None
        resumed = resume.check(pipe.session, inner, lanes)  # other data, positions past the end, a changed G
        if workers:
            self._check_later_passes(resumed.state)
        pipe.session.use_source(resumed.source)  # the state's seed wins, as in Pipeline.load_state_dict
        self._loaded = (lanes, resumed.state)
        self._progress = None

    def _check_later_passes(self, state: State) -> None:
        """In a DataLoader worker, refuse a state of a finite stream written with other data settings
        than the pipeline's own (another seed, a changed schedule): the loader's later iterations, the
        next passes, start in fresh workers from the pipeline as built, which never see the state."""
        spec = self.pipeline.spec
        if any(spec.num_windows(lane) is None for lane in owned_lanes(self.pipeline.description.settings)):
            return  # a stream that never ends has no next pass
        if spec.fingerprint != state.fingerprint:
            raise StateError(
                "the loader state was written with other data settings than this pipeline's:\n"
                + describe_diff(config_diff(state.config, spec.config()))
                + "\nthey apply to this iteration of the loader, but its workers start every later "
                "pass over the stream from the pipeline as built. Build the pipeline with the state's "
                "settings, or resume through pipeline.to_torch_loader(), whose state is the pipeline's")


def _served(lanes, state: State, owned: set[int]) -> list[int]:
    """``lanes``, the lanes a dataset state serves; refused unless they are lanes of the group
    (``owned``) that its progress covers exactly."""
    if (not isinstance(lanes, list) or not set(lanes) <= owned
            or sorted(str(lane) for lane in lanes) != sorted(str(lane) for lane in state.lanes)):
        raise StateError(f"the dataset state serves lanes {lanes!r}, not lanes of this DP group "
                         f"({sorted(owned)}) matching its progress: it is from another topology")
    return lanes


def worker_count_error(taken, workers: int) -> str:
    """The fix for a loader state taken with ``taken`` workers loaded with ``workers``."""
    return (f"the loader state was taken with num_workers={taken}, but it is loaded with num_workers={workers}: "
            f"a StatefulDataLoader resumes only with the worker count its state was taken with, so resume "
            f"with num_workers={taken}. A run that must change it iterates pipeline.to_torch_loader(), whose "
            "state (the pipeline's) resumes under any worker count")


@functools.cache  # once a process: the wrap stays
def check_stateful_loads() -> None:
    """Make torchdata's ``StatefulDataLoader.load_state_dict`` (if torchdata is installed) check a
    state loaded into a loader over a :class:`PipelineDataset` with
    :meth:`PipelineDataset.check_loader_state`, so another ``num_workers`` is refused by name there,
    not by a bare ``AssertionError`` at the next ``iter()``. Other loaders load as before."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return
    load = StatefulDataLoader.load_state_dict
    if getattr(load, "checks_pipeline_states", False):  # already wrapped (the module was reloaded)
        return

    @functools.wraps(load)
    def checked(self, state_dict):
        if state_dict and isinstance(self.dataset, PipelineDataset):
            self.dataset.check_loader_state(state_dict, self.num_workers)
        load(self, state_dict)

    checked.checks_pipeline_states = True  # type: ignore[attr-defined]
    StatefulDataLoader.load_state_dict = checked


def _recorded(progress: Progress, batches: Iterator[dict]) -> Iterator[dict]:
    """``batches`` (a ``DataLoader``'s), each recorded in ``progress`` as the loop receives it."""
    for out in batches:
        window, offset = (int(v) for v in out["position"])
        progress.observe(int(out["lane"]), int(out["index_in_lane"]), window, offset, bool(out["last"]),
                         out["tokens"].numpy(),
                         np.stack((out["dataset_tokens"].numpy(), out["dataset_samples"].numpy())))
        yield out


def whole_steps_only(items: Iterator[dict], progress: Progress, per_lane: int, strict: bool,
                     agreement: StepAgreement | None = None, unagreed: bool = False) -> Iterator[dict]:
    """A loader's batches (``items``) released a global step at a time, ending before the first
    step that is not whole; ``progress``: the iteration's (where in a step it starts, the batches
    per step), ``per_lane``: each lane's batches in a step; ``agreement``: the DP groups' vote,
    held once on each step (see :class:`~zephon_dask.consumer.pass_end.StepAgreement`);
    ``unagreed``: DP groups share the lanes but cannot vote, said once where the pass ends.

    The loader's workers each end on their own lanes' last whole step, which may come after
    another worker's; the loader then goes on with the longer workers' batches, whose steps hold
    fewer batches or (in strict round-robin, ``strict``) several steps of a lane. The pass ends
    there, where one stream over the group's lanes would end it (also when it starts there, at a
    state taken after a pass); the loader is still read to its end (its workers then stop at once)."""
    per_rank, ended = progress.shape.per_rank, False
    need, held = per_rank - progress.delivered % per_rank, []
    first = need < per_rank  # the rest of a step begun before a resume: its lanes may stand apart
    for out in items:
        if ended:
            continue
        held.append(out)
        if len(held) == need:
            whole = first or not strict or len({int(o["index_in_lane"]) // per_lane for o in held}) == 1
            if not first and agreement is not None:
                whole = agreement.vote(whole)
            if not whole:
                ended = True
                continue
            yield from held
            need, held, first = per_rank, [], False
    if not ended and agreement is not None:  # this group has no next step: it votes so once
        agreement.vote(False)
    if unagreed:
        warnings.warn(f"the pass over the stream ends on the last whole global step of this DP group's lanes. "
                      f"{UNAGREED} {KEEP_EVERY_SAMPLE}", ZephonWarning, stacklevel=2)


def loader_generator(seed: int) -> torch.Generator:
    """A ``torch.Generator`` for a loader over a pipeline of seed ``seed`` (deterministic).

    torch's ``DataLoader`` draws a base seed for its workers each time an
    iterator is created, from the loader's ``generator``, else from the global
    torch RNG; a draw there would shift a training framework's restored RNG
    (dropout) on resume. The workers' seeds it gives never reach the data.
    """
    return torch.Generator().manual_seed(stream_keys(seed, "dataloader base seed", n=1)[0])


class PipelineLoader(DataLoader):
    """``DataLoader(PipelineDataset(pipeline), batch_size=None, ...)`` that reports deliveries.

    A real ``DataLoader`` subclass (``.dataset`` is the :class:`PipelineDataset`).
    Each batch the loop receives is recorded in the pipeline's progress (and
    ledger), so ``state_dict()`` (the pipeline's, a plain dict) is exact however
    far the workers have prefetched, and resumes under any worker count. Each
    ``iter()`` is an iteration of the pipeline (see :meth:`Session.next_start`).
    Unless given a ``generator``, it has its own (:func:`loader_generator`):
    creating its iterators draws nothing from the global RNGs.
    """

    follows_training_step = False  # True: its state is the trained batches' (Lightning's fit loop may iterate it)

    def __init__(self, pipeline, num_workers: int = 0, **dataloader_kwargs):
        fixed = sorted(set(dataloader_kwargs) & {"batch_size", "shuffle", "sampler", "batch_sampler",
                                                  "drop_last", "persistent_workers"})
        if fixed:
            raise ConfigError(f"to_torch_loader() does not take {fixed}: batches are cut by "
                              ".batch(microbatch_size, drop_last=...) and lanes are not sampled")
        if dataloader_kwargs.get("generator") is None:
            dataloader_kwargs["generator"] = loader_generator(pipeline.session.source.seed)
        served = PipelineDataset(pipeline)
        super().__init__(served, batch_size=None, num_workers=num_workers, **dataloader_kwargs)
        self.pipeline, self._served = pipeline, served

    # DataLoader's stub promises its own iterator class; this one wraps it (same protocol)
    def __iter__(self) -> Iterator[dict]:  # type: ignore[override]
        if not self.follows_training_step and (refused := refuse_fetching_ahead(
                "a plain pipeline.to_torch_loader()")) is not None:
            return refused  # Lightning would checkpoint it a batch ahead of the step
        return self.pipeline.session.iterate(self._batches, observe=False)

    def _batches(self, progress: Progress) -> Iterator[dict]:
        """The batches of a new ``DataLoader`` iterator for the iteration ``progress`` tracks (its
        workers start where the iteration starts), recorded as the loop receives them."""
        session = self.pipeline.session
        self._served.begin_at(session.start)  # before the workers start: they copy the dataset
        items: Iterator[dict] = super().__iter__()
        end = session.pass_end(session.spec(), progress.lanes, progress.shape) if self.num_workers else None
        if end is not None and end.steps is None:  # each worker ends its own lanes' pass
            agreement, unagreed = session.voting(end, progress)
            items = whole_steps_only(items, progress, end.per_lane, session.description.settings["deterministic"],
                                     agreement, unagreed)
        return _recorded(progress, items)

    def state_dict(self, *, ahead: int | None = None, at_step: int | None = None) -> dict:
        """The pipeline's state (see :meth:`Pipeline.state_dict`)."""
        return self.pipeline.state_dict(ahead=ahead, at_step=at_step)

    def load_state_dict(self, state: dict) -> None:
        """Resume the next iteration from ``state`` (any worker count)."""
        self.pipeline.load_state_dict(state)

    def mark_consumed(self, upto) -> None:
        """See :meth:`Session.mark_consumed`."""
        self.pipeline.session.mark_consumed(upto)
