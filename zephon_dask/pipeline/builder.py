"""``Pipeline``: the chainable builder users write. Holds configuration only.

Data-defining calls (operators, ``.batch``, ``canonical_replicas``,
``flush_every_k_chunks``) build a :class:`PipelineSpec`; execution options are
kept apart and never reach the spec or the fingerprint. Each builder method
validates its arguments at once and returns the pipeline.
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any

from ..consumer.batch import BatchOptions
from ..consumer.stream import BatchStream
from ..curriculum import MixtureWorkSource
from ..curriculum.routing import (
    MAPPING_STRATEGIES,
    check_choice,
    check_replicas,
    check_step,
    group_lanes,
)
from ..errors import ClosedError, ConfigError, StateError, ZephonWarning
from ..operators.base import Accumulator
from ..operators.records import DecodeText, Filter, Map
from ..operators.shuffle import Shuffle
from ..operators.stateful import Stateful
from ..operators.tokenize import Tokenize
from ..state.ledger import LedgerWriter
from ..state.progress import Progress, resume_point
from ..state.schema import check_state, config_diff, describe_diff
from ..validate import is_int_at_least
from .spec import PipelineSpec
from .window import WindowOutput, compute_window

DATA_OPTIONS = {"canonical_replicas": 8, "flush_every_k_chunks": 8}
EXECUTION_OPTIONS = {
    "runner": "distributed",
    "n_workers": None,
    "threads_per_worker": 1,
    "client": None,
    "address": None,
    "prefetch_windows": None,  # None: the runner's default_prefetch()
    "fuse": True,
    "retries": 2,
    "dp_degree": None,
    "dp_group_id": None,
    "mapping_strategy": "contiguous",
    "deterministic": True,
    "batches_per_step": None,
    "ledger": None,
    "cluster_timeout": 45.0,  # seconds without scheduler or worker before a wait fails (execution/watch.py)
    "stall_timeout": 30.0,  # seconds a window may compute before it is reported and recomputed elsewhere
    "dashboard_address": "127.0.0.1:0",  # the embedded cluster's dashboard; None: none
}


class Pipeline:
    """``Pipeline(work_source).tokenize(...).pack(...).batch(...).options(...)``."""

    def __init__(self, work_source: MixtureWorkSource):
        if not isinstance(work_source, MixtureWorkSource):
            raise ConfigError(
                f"Pipeline needs a MixtureWorkSource, got {type(work_source).__name__}; "
                "wrap datasets as MixtureWorkSource([dataset, ...])"
            )
        self.work_source = work_source
        self._record_ops: list = []
        self._accumulators: list[Accumulator] = []
        self._batch = BatchOptions()
        self._options: dict[str, Any] = {**DATA_OPTIONS, **EXECUTION_OPTIONS}
        self._runner = None
        self._runner_fp: str | None = None
        self._stream: BatchStream | None = None
        self._resume: dict | None = None  # the state given to load_state_dict
        self._progress: Progress | None = None  # what the current iteration delivered

    # -- stateless ------------------------------------------------------------------

    def _add_record_op(self, op) -> Pipeline:
        if self._accumulators:
            raise ConfigError(
                f".{op.name}() comes after .{self._accumulators[-1].name}(): stateless operators "
                "run per chunk, before the accumulators; move it earlier in the chain"
            )
        self._record_ops.append(op)
        return self

    def map(self, fn, name: str | None = None, version=None) -> Pipeline:
        return self._add_record_op(Map(fn, name, version))

    def filter(self, fn, name: str | None = None, version=None) -> Pipeline:
        return self._add_record_op(Filter(fn, name, version))

    def decode_text(self, field: str = "text", encoding: str = "utf-8", errors: str = "strict") -> Pipeline:
        return self._add_record_op(DecodeText(field, encoding, errors))

    def tokenize(self, tokenizer="bytes", field: str = "text", bos: bool = False, eos: bool = True,
                 max_length: int | None = None, split_long: bool = False, bos_id=None, eos_id=None,
                 name: str | None = None, version=None) -> Pipeline:
        if any(isinstance(op, Tokenize) for op in self._record_ops):
            raise ConfigError("the pipeline already tokenizes; call .tokenize() once")
        return self._add_record_op(
            Tokenize(tokenizer, field, bos, eos, max_length, split_long, bos_id, eos_id, name, version)
        )

    # -- accumulators ---------------------------------------------------------------

    def _add_accumulator(self, op: Accumulator) -> Pipeline:
        self._accumulators.append(op)
        return self

    def pack(self, max_length: int, algorithm: str = "wrap", pad_id: int = 0,
             num_bins: int | None = None) -> Pipeline:
        from ..operators.pack import Pack

        if any(isinstance(op, Pack) for op in self._accumulators):
            raise ConfigError("the pipeline already packs; call .pack() once")
        self._check_tokens("pack")
        op = Pack(max_length, algorithm, pad_id, num_bins)
        for tok in (o for o in self._record_ops if isinstance(o, Tokenize)):
            tok.check_id(pad_id, "pad_id")  # a pad id outside the vocabulary breaks the embedding
        self._batch = BatchOptions(**{**self._batch.config(), "pad_id": pad_id})
        return self._add_accumulator(op)

    def shuffle(self, buffer_size: int, seed: int | None = None) -> Pipeline:
        self._check_tokens("shuffle")
        return self._add_accumulator(Shuffle(buffer_size, seed))

    def stateful(self, name: str, init, push, flush, version=None) -> Pipeline:
        self._check_tokens("stateful")
        if any(isinstance(op, Stateful) and op.label == name for op in self._accumulators):
            raise ConfigError(f"an accumulator named {name!r} exists already; names are unique")
        return self._add_accumulator(Stateful(name, init, push, flush, version))

    def _check_tokens(self, op: str) -> None:
        pre_tokenized = all(getattr(d, "format", None) == "tokens" for d in self.work_source.datasets)
        if not pre_tokenized and not any(isinstance(o, Tokenize) for o in self._record_ops):
            raise ConfigError(
                f".{op}() needs token ids: call .tokenize(...) first (or read a token store "
                "with Dataset.from_tokens)"
            )

    # -- batch shape and options --------------------------------------------------------

    def batch(self, microbatch_size: int, drop_last: bool = True, labels: bool = False,
              ignore_index: int = -100, mask_document_boundaries: bool = False,
              cu_seqlens: bool = False) -> Pipeline:
        """Record the batch shape; batches are cut per lane by the consumer."""
        self._batch = BatchOptions(microbatch_size, bool(drop_last), bool(labels), ignore_index,
                                   bool(mask_document_boundaries), bool(cu_seqlens), self._batch.pad_id)
        return self

    def options(self, **kwargs) -> Pipeline:
        unknown = sorted(set(kwargs) - set(self._options))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {unknown}; known: {sorted(self._options)}"
            )
        if "canonical_replicas" in kwargs:
            check_replicas(kwargs["canonical_replicas"])
        if "runner" in kwargs:
            from ..execution import RUNNERS

            check_choice(kwargs["runner"], RUNNERS, "runner")
        if "mapping_strategy" in kwargs:
            check_choice(kwargs["mapping_strategy"], MAPPING_STRATEGIES, "mapping_strategy")
        for name in ("prefetch_windows", "n_workers", "threads_per_worker", "dp_degree", "batches_per_step"):
            v = kwargs.get(name)
            if v is not None and not is_int_at_least(v, 1):
                raise ConfigError(f"{name}={v!r} must be a positive int")
        for name in ("retries", "dp_group_id"):
            v = kwargs.get(name)
            if v is not None and not is_int_at_least(v, 0):
                raise ConfigError(f"{name}={v!r} must be a non-negative int")
        for name in ("cluster_timeout", "stall_timeout"):
            if name in kwargs:
                from ..execution.watch import check_timeout

                check_timeout(kwargs[name], name)
        if "flush_every_k_chunks" in kwargs:
            k = kwargs["flush_every_k_chunks"]
            if not is_int_at_least(k, 1):
                raise ConfigError(f"flush_every_k_chunks={k!r} must be a positive int, e.g. 8")
        self._options.update(kwargs)
        return self

    @property
    def batch_options(self) -> BatchOptions:
        return self._batch

    # -- the data definition ---------------------------------------------------------

    @property
    def spec(self) -> PipelineSpec:
        return PipelineSpec(
            self.work_source,
            tuple(self._record_ops),
            tuple(self._accumulators),
            self._options["canonical_replicas"],
            self._options["flush_every_k_chunks"],
        )

    def fingerprint(self) -> str:
        """SHA-256 of every data-defining setting (execution options never change it)."""
        return self.spec.fingerprint

    def compute_window(self, lane: int, window: int) -> WindowOutput:
        """One window, computed here without Dask (for notebooks and tests)."""
        return compute_window(self.spec, lane, window)

    # -- identity -----------------------------------------------------------------------

    def identity(self) -> tuple[int, int]:
        """``(dp_degree, dp_group_id)``: from options, else ``torch.distributed``, else ``(1, 0)``."""
        degree, group = self._options["dp_degree"], self._options["dp_group_id"]
        dist = sys.modules.get("torch.distributed")  # initialised only if the user imported torch
        if (degree is None or group is None) and dist is not None and dist.is_available() and dist.is_initialized():
            degree = dist.get_world_size() if degree is None else degree
            group = dist.get_rank() if group is None else group
        degree = 1 if degree is None else degree
        group = 0 if group is None else group
        if group >= degree:
            raise ConfigError(f"dp_group_id={group} must be < dp_degree={degree}")
        return degree, group

    def owned_lanes(self) -> list[int]:
        """The lanes this DP group owns."""
        degree, group = self.identity()
        return group_lanes(self._options["canonical_replicas"], degree, self._options["mapping_strategy"])[group]

    # -- execution ------------------------------------------------------------------------

    def runner(self):
        """The started runner for the current spec (started on first use, reused after)."""
        if self.__dict__.get("_closed"):
            raise ClosedError("this pipeline is closed; build a new one (or use it in a `with` block "
                              "only once) instead of iterating it again from its start")
        spec = self.spec
        if self._runner is not None and self._runner_fp != spec.fingerprint:
            self._runner.close()
            self._runner = None
        if self._runner is None:
            from ..execution import make_runner

            self._runner = make_runner(spec, self._options)
            self._runner_fp = spec.fingerprint
        return self._runner

    def _tracked_stream(self, progress: Progress) -> BatchStream:
        stream = self._open_stream(progress.lanes, progress.first_lane)
        stream.on_finish = progress.lane_finished
        return stream

    def _open_stream(self, lanes: list[int], first_lane: int | None = None) -> BatchStream:
        """A stream over ``lanes`` starting at the loaded state (or the beginning)."""
        if self._stream is not None:
            self._stream.close()
        start, _ = resume_point(self._resume, lanes)
        runner = self.runner()
        self._stream = BatchStream(
            self.spec, self._batch, lanes, runner, self._options["prefetch_windows"] or runner.default_prefetch(),
            deterministic=self._options["deterministic"], fused=self._options["fuse"],
            start={lane: p.as_dict() for lane, p in start.items()}, first_lane=first_lane,
        )
        return self._stream

    def _begin(self) -> Progress:
        """Start tracking a new iteration over this group's lanes (from the loaded state)."""
        if self._progress is not None:
            self._progress.close()
        if self._resume is not None:
            self._check_covers(self._resume, self.owned_lanes())
        ledger = self._options["ledger"]
        self._progress = self._new_progress(LedgerWriter(ledger, self._rank()) if ledger is not None else None)
        return self._progress

    def _new_progress(self, ledger: LedgerWriter | None = None) -> Progress:
        """Progress of an iteration starting at the loaded state (or the beginning)."""
        return Progress(self.spec, self.owned_lanes(), self._resume, *self._step_shape(), ledger)

    def _current_progress(self) -> Progress:
        """The current (or last) iteration's progress; before the first, where one would start."""
        return self._progress if self._progress is not None else self._new_progress()

    def __iter__(self):
        """Batches of this group's lanes, in strict round-robin (from the loaded state, if any)."""
        progress = self._begin()
        return self._serve(self._tracked_stream(progress), progress.observe_batch)

    def to_torch(self, device=None, pin_memory: bool | None = None, prefetch: int = 2):
        """Yield dicts of torch tensors; on CUDA pinned and copied ahead on a side stream."""
        from ..consumer.torch_io import to_device_iter

        progress = self._begin()
        return self._serve(to_device_iter(self._tracked_stream(progress), device=device, pin_memory=pin_memory,
                                          depth=prefetch, on_deliver=progress.observe_batch))

    def _serve(self, items, deliver=None):
        """Yield ``items`` (recording each with ``deliver`` as the caller receives it), keeping
        this pipeline, and so its runner, alive while the iterator is in use."""
        for item in items:
            if deliver is not None:
                deliver(item)
            yield item

    def to_torch_dataset(self):
        """An ``IterableDataset`` for ``DataLoader(num_workers=n)`` (lanes split across workers).

        A plain ``DataLoader`` does not report what it delivered; use
        :meth:`to_torch_loader` when you need :meth:`state_dict`.
        """
        from ..consumer.torch_io import PipelineDataset

        return PipelineDataset(self)

    def to_torch_loader(self, num_workers: int = 0, **dataloader_kwargs):
        """A ``DataLoader`` over this pipeline whose deliveries feed :meth:`state_dict` and the ledger."""
        from ..consumer.torch_io import PipelineLoader

        return PipelineLoader(self, num_workers=num_workers, **dataloader_kwargs)

    # -- checkpoints ------------------------------------------------------------------------

    def _step_shape(self) -> tuple[int, bool, int]:
        """``(batches_per_step, set explicitly, dp_degree)``; checks that the step is elastic."""
        degree, _ = self.identity()
        n = self._options["batches_per_step"]
        if n is None:  # one round-robin cycle over the owned lanes
            return len(self.owned_lanes()), False, degree
        return check_step(n, degree, self._options["canonical_replicas"]), True, degree

    def _rank(self) -> int:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return self.identity()[1]

    @staticmethod
    def _check_covers(state: dict, lanes: list[int]) -> None:
        missing = [lane for lane in lanes if str(lane) not in state["lanes"]]
        if missing:
            raise StateError(
                f"the state has no progress for lanes {missing}, which this group owns: a rank's "
                "state holds only its own lanes. Resume from the merged state of all ranks "
                "(zephon_dask.gather_state(pipeline), or zephon_dask.merge_states(states))"
            )

    def state_dict(self) -> dict:
        """JSON-native progress of what this group's iteration delivered to the caller."""
        return self._current_progress().state()

    def load_state_dict(self, state: dict) -> Pipeline:
        """Resume from ``state`` at the next iteration; refuses a state of other data.

        The seed comes from the state (with a warning if this pipeline says
        otherwise). A different ``canonical_replicas`` or any other
        data-defining difference raises :class:`StateError`; execution
        options, DP degree and mapping, DataLoader workers and the microbatch
        size may change.
        """
        state = check_state(state)
        saved = state["config"]
        replicas = saved.get("canonical_replicas")
        if replicas != self._options["canonical_replicas"]:
            raise StateError(
                f"the checkpoint was written with canonical_replicas={replicas} but this pipeline has "
                f"canonical_replicas={self._options['canonical_replicas']}; lanes are fixed for a run's "
                f"lifetime: set .options(canonical_replicas={replicas})"
            )
        source = self.work_source
        seed = saved.get("source", {}).get("seed")
        if isinstance(seed, int) and seed != source.seed:
            source = source.with_seed(seed)
        spec = PipelineSpec(source, tuple(self._record_ops), tuple(self._accumulators),
                            self._options["canonical_replicas"], self._options["flush_every_k_chunks"])
        diff = config_diff(saved, spec.config())
        if diff:
            raise StateError("the checkpoint was written by a different data configuration:\n"
                             + describe_diff(diff))
        if spec.fingerprint != state["fingerprint"]:
            raise StateError(f"the checkpoint's fingerprint {state['fingerprint'][:16]} does not match its "
                             f"own config ({spec.fingerprint[:16]}): the file was edited or corrupted")
        self._check_covers(state, self.owned_lanes())
        if source is not self.work_source:
            warnings.warn(f"resuming with the checkpoint's seed {seed}, not this pipeline's seed "
                          f"{self.work_source.seed}", ZephonWarning, stacklevel=2)
            self.work_source = source
        self._resume = copy.deepcopy(state)
        self._progress = None
        return self

    def close(self) -> None:
        """Stop the iteration, and the cluster or threads this pipeline started. Iterating or
        computing on the cluster afterwards raises :class:`ClosedError`."""
        self._closed = True
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._progress is not None:
            self._progress.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: best effort
            pass

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_runner"] = state["_stream"] = state["_runner_fp"] = state["_progress"] = None
        return state

    # -- inspection (zephon_dask.inspect) --

    @classmethod
    def from_config(cls, path) -> Pipeline:
        """The pipeline a TOML recipe describes (see ``docs/recipes.md``)."""
        from ..recipe import load_recipe

        return load_recipe(path).pipeline()

    def explain(self):
        """A readable plan: datasets, mixture, lanes, operators, runner, warnings."""
        from ..inspect import explain

        return explain(self)

    def preview(self, n: int = 3, lane: int = 0):
        """The first ``n`` rows of ``lane`` decoded to text, with each document's lineage."""
        from ..inspect import preview

        return preview(self, n, lane)

    def plan(self, dp_degrees=(1, 2, 4, 8)):
        """The lane-to-group table for each DP degree and mapping, with load imbalance."""
        from ..inspect import plan_table

        return plan_table(self, dp_degrees)

    def window_graph(self, lane: int, window: int, fused: bool | None = None):
        """The Dask graph of one window (``.visualize()`` draws it when graphviz is installed)."""
        from ..inspect import window_graph

        return window_graph(self, lane, window, fused)

    def stats(self):
        """Progress of the current iteration: lanes, windows, tokens/s, efficiency, mixture."""
        from ..inspect import stats

        return stats(self)

    def plot_mixture(self, ax=None):
        """Realized mixture per global step against the target (matplotlib)."""
        from ..inspect import plot_mixture

        return plot_mixture(self.stats(), ax)

    def plot_packing(self, ax=None):
        """Padding efficiency per global step (matplotlib)."""
        from ..inspect import plot_packing

        return plot_packing(self.stats(), ax)

    def _repr_html_(self) -> str:
        from ..inspect import pipeline_html

        return pipeline_html(self)

