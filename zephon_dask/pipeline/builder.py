"""``Pipeline``: the chainable builder users write. Holds configuration only.

Data-defining calls (operators, ``.batch``, ``canonical_replicas``,
``flush_every_k_chunks``) build a :class:`PipelineSpec`; execution options are
kept apart and never reach the spec or the fingerprint. Each builder method
validates its arguments at once and returns the pipeline.
"""

from __future__ import annotations

import copy
import difflib
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
    group_lanes,
)
from ..errors import ClosedError, ConfigError, StateError, ZephonWarning
from ..log import logger
from ..operators.base import Accumulator
from ..operators.records import DecodeText, Filter, Map
from ..operators.shuffle import Shuffle
from ..operators.stateful import Stateful
from ..operators.tokenize import Tokenize
from ..state.ledger import LedgerWriter
from ..state.progress import Progress, StepShape, resume_point
from ..state.schema import check_state, config_diff, describe_diff
from ..validate import is_int_at_least
from . import steps
from ..core.spec import PipelineSpec
from ..core.window import WindowOutput, compute_window

_END = object()  # the end of an iterator (next()'s default)
DATA_OPTIONS = {"canonical_replicas": 8, "flush_every_k_chunks": 8}
EXECUTION_OPTIONS = {
    "runner": "distributed",
    "n_workers": None,
    "threads_per_worker": 1,
    "client": None,
    "address": None,
    "session_client": True,
    "prefetch_windows": None,  # None: the runner's default_prefetch()
    "fuse": True,
    "retries": 2,
    "dp_degree": None,
    "dp_group_id": None,
    "mapping_strategy": "contiguous",
    "deterministic": True,
    "batches_per_step": None,  # per rank; with global_batches_per_step, the step contract
    "global_batches_per_step": None,  # (pipeline/steps.py): data settings kept out of the spec
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
        self._generation = 0  # bumped by each iteration and load: older iterators are superseded
        self._handed_out = False  # to_torch_dataset() was called: deliveries happen out of sight

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
        """Apply ``fn(record) -> record`` to every record, in its chunk task (stateless).

        Args:
            fn: a function taking a record dict and returning a dict (the record,
                changed or not). It must be pure: same record, same output.
            name: a stable name for ``fn`` in the fingerprint (default: its
                qualified name and a hash of its bytecode).
            version: pin ``fn``'s identity (any str or int): the bytecode hash is
                then left out, so the fingerprint survives a Python upgrade; bump
                it when the function's behaviour changes.

        Returns:
            The pipeline (the chain continues).

        Raises:
            ConfigError: ``fn`` is not callable, or an accumulator (``pack``,
                ``shuffle``, ``stateful``) comes earlier in the chain.

        Example:
            >>> pipeline.map(lambda r: {**r, "text": r["text"].strip()})  # doctest: +SKIP
        """
        return self._add_record_op(Map(fn, name, version))

    def filter(self, fn, name: str | None = None, version=None) -> Pipeline:
        """Keep the records for which ``fn(record)`` is true, in their chunk task (stateless).

        Args:
            fn: a pure predicate on a record dict.
            name, version: ``fn``'s identity in the fingerprint, as for :meth:`map`.

        Returns:
            The pipeline. ``stats()`` counts the records dropped (``filter.dropped``).

        Raises:
            ConfigError: ``fn`` is not callable, or an accumulator comes earlier.

        Example:
            >>> pipeline.filter(lambda r: len(r["text"]) > 200)  # doctest: +SKIP
        """
        return self._add_record_op(Filter(fn, name, version))

    def decode_text(self, field: str = "text", encoding: str = "utf-8", errors: str = "strict") -> Pipeline:
        """Decode a bytes field to ``str`` in place (stateless; a ``str`` passes unchanged).

        Args:
            field: the record field holding bytes.
            encoding: any Python codec name.
            errors: ``"strict"`` (a bad byte raises ``DataFormatError`` naming the
                record), ``"replace"`` or ``"ignore"``.

        Returns:
            The pipeline.

        Raises:
            ConfigError: an empty field name or an unknown codec.

        Example:
            >>> pipeline.decode_text("content", encoding="latin-1")  # doctest: +SKIP
        """
        return self._add_record_op(DecodeText(field, encoding, errors))

    def tokenize(self, tokenizer="bytes", field: str = "text", bos: bool = False, eos: bool = True,
                 max_length: int | None = None, split_long: bool = False, bos_id=None, eos_id=None,
                 name: str | None = None, version=None) -> Pipeline:
        """Encode ``record[field]`` into token ids, a chunk at a time (stateless).

        Args:
            tokenizer: ``"bytes"`` (UTF-8 bytes, BOS 256, EOS 257; needs no file),
                the path of a Hugging Face ``tokenizer.json``, a
                ``tokenizers.Tokenizer``, or a callable ``str -> list[int]``.
            field: the text field.
            bos, eos: add the tokenizer's BOS / EOS id around each document.
            max_length: cap a document's tokens (BOS/EOS included); the rest is
                dropped and counted (``tokenize.truncated_tokens``) unless
                ``split_long``.
            split_long: cut long documents into ``max_length`` pieces instead.
            bos_id, eos_id: the special ids (an int, or a token string for a
                Hugging Face tokenizer; found by name when not given).
            name, version: a callable tokenizer's identity in the fingerprint.

        Returns:
            The pipeline.

        Raises:
            ConfigError: a second ``tokenize``, an unsupported tokenizer, a missing
                special token, or a bad length setting.
            DatasetNotFoundError: the ``tokenizer.json`` path does not exist.

        Example:
            >>> pipeline.tokenize("tokenizer.json", bos=True, eos=True)  # doctest: +SKIP
        """
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
        """Pack each window's documents into rows of exactly ``max_length`` token slots.

        An accumulator: it runs per (lane, window), starts empty and is flushed
        at the window's end, so rows never mix lanes or windows.

        Args:
            max_length: tokens per row (e.g. 2048).
            algorithm: ``"wrap"`` (concatenate and cut; the window's leftover
                tokens are dropped and counted), ``"first_fit"`` or ``"best_fit"``
                (whole documents into bins, padded with ``pad_id``).
            pad_id: the padding id of the bin-packing algorithms (and of batches).
            num_bins: open bins of ``first_fit``/``best_fit`` (default 64).

        Returns:
            The pipeline.

        Raises:
            ConfigError: a second ``pack``, no tokens yet (call ``tokenize``
                first), or a bad setting.

        Example:
            >>> pipeline.pack(2048, algorithm="best_fit")  # doctest: +SKIP
        """
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
        """Shuffle each window's samples through a reservoir of ``buffer_size`` (an accumulator).

        The randomness comes from each sample's identity and the seed, never from a
        counter, so the order is the same on any runner and after any resume.

        Args:
            buffer_size: samples held in the reservoir (larger mixes more).
            seed: this shuffle's seed (default: the work source's seed).

        Returns:
            The pipeline.

        Raises:
            ConfigError: a bad ``buffer_size`` or no tokens yet.

        Example:
            >>> pipeline.shuffle(1024)  # doctest: +SKIP
        """
        self._check_tokens("shuffle")
        return self._add_accumulator(Shuffle(buffer_size, seed))

    def stateful(self, name: str, init, push, flush, version=None) -> Pipeline:
        """Add your own accumulator: ``init()``, ``push(state, sample)``, ``flush(state)``.

        ``init`` makes a fresh state at each window's start; ``push`` returns the
        samples to emit now (possibly none); ``flush`` returns what is left at the
        window's end. Samples are ``Sample(tokens, positions, document_ids,
        lineage)`` named tuples. The functions must be pure given their inputs.

        Args:
            name: a unique name for this accumulator.
            init, push, flush: the three functions.
            version: pin the functions' identity in the fingerprint (see :meth:`map`).

        Returns:
            The pipeline.

        Raises:
            ConfigError: the name is taken, or no tokens yet.

        Example:
            >>> pipeline.stateful("dedup", set, push, lambda s: [])  # doctest: +SKIP
        """
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

    def batch(self, microbatch_size: int, drop_last: bool = True, labels: bool | str = False,
              ignore_index: int = -100, mask_document_boundaries: bool = False,
              cu_seqlens: bool = False) -> Pipeline:
        """Set the batch shape (a data setting: it decides which samples land together).

        Batches are cut per lane by the consumer and never mix lanes.

        Args:
            microbatch_size: samples per batch.
            drop_last: drop a lane's last partial batch.
            labels: also build ``input_ids``, ``labels`` and ``loss_mask``: ``True`` or
                ``"shifted"`` gives next-token targets; ``"hf"`` unshifted labels with
                ``attention_mask`` and ``position_ids``, for models that shift themselves
                (Hugging Face causal LMs).
            ignore_index: the label of positions that are not trained on.
            mask_document_boundaries: no label across a document boundary.
            cu_seqlens: also build ``cu_seqlens`` for variable-length attention.

        Returns:
            The pipeline.

        Raises:
            ConfigError: ``microbatch_size`` is not a positive int, or
                ``ignore_index`` is not an int.

        Example:
            >>> pipeline.batch(8, labels=True)  # doctest: +SKIP
        """
        self._batch = BatchOptions(microbatch_size, bool(drop_last), labels, ignore_index,
                                   bool(mask_document_boundaries), bool(cu_seqlens), self._batch.pad_id)
        return self

    def options(self, **kwargs) -> Pipeline:
        """Set data options (``canonical_replicas``, ``flush_every_k_chunks``) and execution options.

        Execution options never change a byte of the data: ``runner``
        (``"distributed"``, ``"threads"``, ``"synchronous"``), ``n_workers``,
        ``threads_per_worker``, ``client``, ``address``, ``session_client``
        (use the Dask client this process made current, default True),
        ``prefetch_windows``, ``fuse``, ``retries``, ``dp_degree``,
        ``dp_group_id``, ``mapping_strategy``, ``deterministic``, ``ledger``.
        ``batches_per_step`` fixes the global step (see docs/checkpointing.md).

        Returns:
            The pipeline.

        Raises:
            ConfigError: an unknown option (with the closest known name) or a bad value.

        Example:
            >>> pipeline.options(canonical_replicas=8, prefetch_windows=6)  # doctest: +SKIP
        """
        for key in sorted(kwargs):
            if key not in self._options:
                close = difflib.get_close_matches(key, list(self._options), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"unknown option {key!r}; {hint}known: {', '.join(sorted(self._options))}")
        for name in ("fuse", "deterministic", "session_client"):
            if name in kwargs and not isinstance(kwargs[name], bool):
                raise ConfigError(f"{name}={kwargs[name]!r} must be True or False")
        if "canonical_replicas" in kwargs:
            check_replicas(kwargs["canonical_replicas"])
        if "runner" in kwargs:
            from ..execution import RUNNERS

            check_choice(kwargs["runner"], RUNNERS, "runner")
        if "mapping_strategy" in kwargs:
            check_choice(kwargs["mapping_strategy"], MAPPING_STRATEGIES, "mapping_strategy")
        for name in ("prefetch_windows", "n_workers", "threads_per_worker", "dp_degree", "batches_per_step",
                     "global_batches_per_step"):
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
        if kwargs.get("global_batches_per_step") is not None:
            steps.check_global(kwargs["global_batches_per_step"],
                               kwargs.get("canonical_replicas", self._options["canonical_replicas"]))
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
        if self._stream is not None:
            self._stream.close()
        self._stream = self.open_stream(progress.lanes, self._resume, progress.first_lane)
        self._stream.on_finish = progress.lane_finished
        return self._stream

    def open_stream(self, lanes: list[int], resume: dict | None, first_lane: int | None = None) -> BatchStream:
        """A new stream over ``lanes`` starting at ``resume`` (a state; ``None``: the beginning)."""
        start, _ = resume_point(resume, lanes)
        runner = self.runner()
        return BatchStream(
            self.spec, self._batch, lanes, runner, self._options["prefetch_windows"] or runner.default_prefetch(),
            deterministic=self._options["deterministic"], fused=self._options["fuse"],
            start={lane: p.as_dict() for lane, p in start.items()}, first_lane=first_lane,
        )

    def _begin(self) -> tuple[Progress, int]:
        """Start tracking a new iteration over this group's lanes (from the loaded state).

        The new iteration supersedes any older one: the older iterator raises
        if used again, and its ledger file is closed. Returns the progress and
        the iteration's generation.
        """
        if self._resume is not None:
            self._check_covers(self._resume, self.owned_lanes())
        shape = self.step_shape()
        self._end_iteration()
        ledger = self._options["ledger"]
        self._progress = self._new_progress(LedgerWriter(ledger, self._rank()) if ledger is not None else None,
                                            shape)
        self._handed_out = False
        return self._progress, self._generation

    def _end_iteration(self) -> None:
        """Supersede the current iteration (its iterator raises if used again)."""
        self._generation += 1
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._progress is not None:
            self._progress.close()

    def _new_progress(self, ledger: LedgerWriter | None = None, shape: StepShape | None = None) -> Progress:
        """Progress of an iteration starting at the loaded state (or the beginning)."""
        return Progress(self.spec, self.owned_lanes(), self._resume, shape or self.step_shape(), ledger)

    def _current_progress(self) -> Progress:
        """The current (or last) iteration's progress; before the first, where one would start."""
        return self._progress if self._progress is not None else self._new_progress()

    def __iter__(self):
        """Batches of this group's lanes, in strict round-robin (from the loaded state, if any).

        A newer ``iter()`` (or :meth:`load_state_dict`) supersedes this
        iterator: using it afterwards raises :class:`StateError`.
        """
        progress, generation = self._begin()
        return self._serve(self._tracked_stream(progress), generation, progress.observe_batch)

    def to_torch(self, device=None, pin_memory: bool | None = None, prefetch: int = 2):
        """Yield dicts of torch tensors; on CUDA pinned and copied ahead on a side stream."""
        from ..consumer.torch_io import to_device_iter

        progress, generation = self._begin()
        return self._serve(to_device_iter(self._tracked_stream(progress), device=device, pin_memory=pin_memory,
                                          depth=prefetch, on_deliver=progress.observe_batch), generation)

    def check_live(self, generation: int) -> None:
        """Raise :class:`StateError` if the iteration ``generation`` was superseded."""
        if generation != self._generation:
            raise StateError(
                "this iterator was superseded: a newer iter() over the same pipeline, or a "
                "load_state_dict(), started another iteration, and the pipeline's state and ledger "
                "follow that one. Use the newest iterator, or a separate Pipeline per concurrent stream"
            )

    def _serve(self, items, generation: int, deliver=None):
        """Yield ``items`` (recording each with ``deliver`` as the caller receives it) while the
        iteration is live, keeping this pipeline, and so its runner, alive while in use."""
        items = iter(items)
        while True:
            self.check_live(generation)
            item = next(items, _END)
            if item is _END:
                return
            if deliver is not None:
                deliver(item)
            yield item

    def to_torch_dataset(self):
        """An ``IterableDataset`` for ``DataLoader(num_workers=n)`` (lanes split across workers).

        It implements torchdata's ``Stateful`` protocol (also inside workers),
        so ``StatefulDataLoader(pipeline.to_torch_dataset(), batch_size=None,
        num_workers=n)`` checkpoints and resumes exactly, in O(1). This
        pipeline cannot see what such a loader delivered: its
        :meth:`state_dict` raises until it iterates again; take the state
        from the loader, or use :meth:`to_torch_loader`.
        """
        from ..consumer.torch_io import PipelineDataset

        self._handed_out = True
        return PipelineDataset(self)

    def to_torch_loader(self, num_workers: int = 0, **dataloader_kwargs):
        """A ``DataLoader`` (subclass) over this pipeline whose deliveries feed :meth:`state_dict`
        and the ledger; its own ``state_dict``/``load_state_dict`` are this pipeline's."""
        from ..consumer.torch_io import PipelineLoader

        return PipelineLoader(self, num_workers=num_workers, **dataloader_kwargs)

    # -- checkpoints ------------------------------------------------------------------------

    def step_shape(self) -> StepShape:
        """The global step at this group's degree (``per_rank`` batches here, ``global_batches``
        over all ranks), from the options and a loaded state (see :mod:`.steps`)."""
        degree, _ = self.identity()
        return self._shape_for(self._resume, degree)

    def _shape_for(self, state: dict | None, degree: int) -> StepShape:
        saved = state["step"] if state is not None else {"global_batches": None, "microbatch_size": 0}
        return steps.step_shape(self._options["canonical_replicas"], degree, len(self.owned_lanes()),
                                self._options["batches_per_step"], self._options["global_batches_per_step"],
                                saved["global_batches"], self._batch.microbatch_size, saved["microbatch_size"])

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

    def state_dict(self, *, ahead: int | None = None, at_step: int | None = None) -> dict:
        """Progress of what this group's iteration delivered to the caller: a plain ``dict``.

        By default the state after every delivered batch, or after the batch
        :meth:`mark_consumed` last named. ``ahead=k`` leaves out the last ``k``
        deliveries (fetched ahead of the step: a resume delivers them again);
        ``at_step=N`` is the state at the end of global step ``N``. Both reach
        back at most :data:`~zephon_dask.state.progress.CONSUMED_RING` batches.
        """
        if self._handed_out:
            raise StateError(
                "this pipeline was handed to a DataLoader by to_torch_dataset(), so it cannot see what "
                "the loader delivered. Take the state from the loader (torchdata's StatefulDataLoader"
                ".state_dict()), or iterate pipeline.to_torch_loader(), whose deliveries this pipeline "
                "records"
            )
        return self._current_progress().state(ahead, at_step)

    def mark_consumed(self, upto) -> None:
        """The training step consumed deliveries up to ``upto`` (a batch, or a count of this
        iteration's deliveries); :meth:`state_dict` then leaves out those fetched after it."""
        if self._progress is None:
            raise StateError("mark_consumed() needs an iteration in progress; iterate the pipeline first")
        self._progress.mark_consumed(upto)

    def load_state_dict(self, state: dict) -> Pipeline:
        """Resume from ``state`` at the next iteration; refuses a state of other data.

        The seed comes from the state (with a warning if this pipeline says
        otherwise). A different ``canonical_replicas`` or any other
        data-defining difference raises :class:`StateError`; execution
        options, DP degree and mapping, DataLoader workers and the microbatch
        size may change.
        """
        state, source = self.check_resumable(state, self.owned_lanes())
        self._shape_for(state, self.identity()[0])  # refuses a step the checkpoint's would not match
        if source is not self.work_source:
            warnings.warn(f"resuming with the checkpoint's seed {source.seed}, not this pipeline's seed "
                          f"{self.work_source.seed}", ZephonWarning, stacklevel=2)
            self.work_source = source
        self._end_iteration()
        self._resume = copy.deepcopy(state)
        self._progress = None
        self._handed_out = False
        lanes = {int(k): v for k, v in state["lanes"].items()}
        logger.info("resuming at global step %d: lane frontiers (window, offset) %s",
                    state["step"]["global_step"],
                    {lane: (lanes[lane]["window"], lanes[lane]["offset"]) for lane in self.owned_lanes()})
        return self

    def check_resumable(self, state: dict, lanes: list[int]):
        """``(state, work source)``: ``state`` validated (and migrated) for ``lanes`` of this data,
        with the work source carrying the state's seed. Raises :class:`StateError`; changes nothing."""
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
        self._check_covers(state, lanes)
        self._check_positions(spec, state)
        return state, source

    @staticmethod
    def _check_positions(spec: PipelineSpec, state: dict) -> None:
        """Refuse lane progress the stream cannot have produced (beyond its end, or inconsistent)."""
        for key, p in sorted(state["lanes"].items(), key=lambda kv: int(kv[0])):
            lane = int(key)
            where = f"the state's lane {lane} ({p})"
            if lane >= spec.canonical_replicas:
                raise StateError(f"{where} is beyond canonical_replicas={spec.canonical_replicas}: "
                                 "the state is corrupted or from another run")
            n = spec.num_windows(lane)
            if n is None and p["finished"]:
                raise StateError(f"{where} says the lane finished, but this stream never ends "
                                 "(exhausted_policy='repeat'): the state is corrupted")
            if n is not None and (p["window"] > n or (p["window"] == n and p["offset"])):
                raise StateError(f"{where} lies beyond the lane's last window ({n - 1}): the state is "
                                 "corrupted or from longer data")
            if (p["batches_delivered"] == 0) != (p["window"] == 0 and p["offset"] == 0) and not p["finished"]:
                raise StateError(f"{where}: a lane's position moves exactly when it has delivered a "
                                 "batch; the state is corrupted")

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

    def __repr__(self) -> str:
        from ..inspect import pipeline_text

        return pipeline_text(self)

    def _repr_html_(self) -> str:
        from ..inspect import pipeline_html

        return pipeline_html(self)

