"""``Session``: a pipeline's runtime. Holds state: the runner, the iteration, the resume point.

A :class:`~zephon_dask.pipeline.Pipeline` is an immutable description; the
session it owns is everything that happens when it runs:

* the **runner** (started on first use, closed by :meth:`Session.close`);
* the **work source**, one name per form: as the pipeline was built
  (:attr:`built_source`); as this session runs it (:attr:`source`: the built
  one, or one carrying a loaded state's seed and tokens per sample); that one
  with its tokens per sample measured (:meth:`measured_source`: a
  token-weighted source without them is measured once, on first use, with the
  pipeline's record operators, :mod:`.measure`; one that leaves its chunk size
  open gets it chosen for the lanes, once, :mod:`~zephon_dask.curriculum.chunking`);
  and with a schedule given in global steps resolved to chunk blocks
  (``spec().source``, what the batches come from);
* the **loaded state**: the :class:`~zephon_dask.state.State` given to
  ``load_state_dict``, checked by :func:`.resume.check`;
  its G and seed hold for the session, and the next iteration starts at it,
  once (:attr:`pending`);
* the **iteration**: where it started (:attr:`start`), its
  :class:`~zephon_dask.consumer.BatchStream` and the
  :class:`~zephon_dask.state.progress.Progress` of what the caller received.
  Each new iteration (``iter()``, ``to_torch()``, a loader's ``iter()``, or a
  ``load_state_dict``) bumps :attr:`generation`, and iterators of an older
  generation raise when used again. An iteration that does not start at a
  loaded state starts a new pass over the stream (:meth:`next_start`); one
  that starts at a loaded state with nothing left in the pass, on any lane of
  the state, goes on into the next pass (:meth:`iterate`).

A session never sees its pipeline: it receives the pipeline's
:class:`~.description.Description` (record operators, accumulators, batch
shape, settings) and the work source, and derives from them and its own
loaded state the spec (:meth:`Session.spec`, a schedule resolved for the
global step by :mod:`zephon_dask.core.phases`, cached) and the step shape
(:meth:`Session.step_shape`, a checkpoint's G kept; :func:`.resume.shape_for`).
The DP identity and rank come from the settings (:mod:`.ranks`).

The public attributes and methods here are what the torch adapters, the
inspectors and the CLI read; nothing outside this module touches the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .. import torch_dist
from ..consumer.pass_end import PassEnd, StepAgreement
from ..consumer.settings import ConsumerSettings
from ..consumer.stream import BatchStream
from ..core import phases
from ..core.spec import PipelineSpec, has_tokens
from ..curriculum import MixtureWorkSource
from ..curriculum.chunking import fitted
from ..errors import ClosedError, ConfigError, EmptyStreamError, StateError
from ..execution import Runner, make_runner
from ..inspect.counting import known_rows
from ..operators.base import one_to_one
from ..state import steps
from ..state.ledger import LedgerWriter
from ..state.progress import Progress, behind, resume_point
from ..state.schema import State
from ..state.steps import StepShape
from .description import Description
from .measure import measured
from .ranks import dp_identity, owned_lanes, process_rank
from .resume import check_covers, shape_for

_END = object()  # the end of an iterator (next()'s default)

SUPERSEDED = ("this iterator was superseded: a newer iter() over the same pipeline, or a "
              "load_state_dict(), started another iteration, and the pipeline's state and ledger "
              "follow that one. Use the newest iterator, or a separate Pipeline per concurrent stream")
HANDED_OUT = ("this pipeline was handed to a DataLoader by to_torch_dataset(), so it cannot see what "
              "the loader delivered. Take the state from the loader (torchdata's StatefulDataLoader"
              ".state_dict()), or iterate pipeline.to_torch_loader(), whose deliveries this pipeline "
              "records")


class Session:
    """The runtime of one :class:`Pipeline` (see the module docstring). Holds state."""

    def __init__(self, source: MixtureWorkSource, description: Description, built: MixtureWorkSource | None = None):
        self.description = description  # the pipeline's operators, batch shape and settings
        self._resolved: tuple | None = None  # (source, (G, microbatch), its schedule resolved)
        self.built_source = source if built is None else built  # the pipeline's source as built
        self._source = source  # `source`: the built one, or one with a checkpoint's seed and measurement
        self._measured: MixtureWorkSource | None = None  # `source` measured, once needed
        self.resume: State | None = None  # the checked state given to load_state_dict (its G, its seed)
        self.pending = False  # the next iteration starts at `resume` (a loaded state applies once)
        self.start: State | None = None  # where the current iteration started (None: the stream's beginning)
        self.from_loaded = False  # the current iteration started at the loaded state
        self.progress: Progress | None = None  # what the current (or last) iteration delivered
        self.stream: BatchStream | None = None  # the current (or last, closed) iteration's stream
        self.generation = 0
        self.handed_out = False  # to_torch_dataset() was called: deliveries happen out of sight
        self.closed = False
        self.evaluation = False  # an evaluation's iterations: every sample (see serve_evaluation)
        self._runner: Runner | None = None
        self._runner_fp: str | None = None

    # -- the work source -----------------------------------------------------------------

    @property
    def source(self) -> MixtureWorkSource:
        """The work source this session runs: the pipeline's as built, or after a resume one with
        the checkpoint's seed and tokens per sample (never measured here; see :meth:`measured_source`)."""
        return self._source

    def use_source(self, source: MixtureWorkSource) -> None:
        """Run ``source`` from now on (a checked resume's: the checkpoint's seed wins)."""
        self._source, self._measured = source, None

    def measured_source(self) -> MixtureWorkSource:
        """:attr:`source`, measured if it weighs by tokens and has no tokens per sample yet
        (measured once per session), and with its chunk size chosen for the lanes if it leaves
        it open (:func:`~zephon_dask.curriculum.chunking.fitted`)."""
        if self._measured is None:
            if self._source.unmeasured and not has_tokens(self._source, self.description.record_ops):
                raise ConfigError(
                    "the work source weighs by tokens (weight_by='tokens'), measured with the pipeline's "
                    "tokenizer: call .tokenize(...) before using the pipeline's data"
                )
            source = measured(self._source, self.description.record_ops)
            self._measured = fitted(source, self.description.settings["canonical_replicas"])
        return self._measured

    def _resolved_source(self) -> MixtureWorkSource:
        """:meth:`measured_source`, a schedule given in global steps resolved to chunk blocks for the
        current batch shape and global step (cached; after a load, the checkpoint's)."""
        source = self.measured_source()
        if source.phases is None:
            return source
        key = (self.step_shape().global_batches, self.description.batch.microbatch_size)
        if self._resolved is None or self._resolved[0] is not source or self._resolved[1] != key:
            spec = PipelineSpec.of(source, self.description.record_ops, self.description.accumulators,
                                   self.description.settings, self.description.batch_ops)
            self._resolved = (source, key, phases.resolve(spec, *key, known=dict(enumerate(source.phase_chunks or ()))))
        return self._resolved[2]

    def spec(self) -> PipelineSpec:
        """The data definition this session runs (see ``Pipeline.spec``)."""
        d = self.description
        return PipelineSpec.of(self._resolved_source(), d.record_ops, d.accumulators, d.settings, d.batch_ops)

    def identity(self) -> tuple[int, int]:
        """``(dp_degree, dp_group_id)``: from the options, else ``torch.distributed``, else ``(1, 0)``.

        Raises:
            ConfigError: ``dp_group_id`` is not below ``dp_degree``.

        Example:
            >>> pipeline.options(dp_degree=2, dp_group_id=1).session.identity()  # doctest: +SKIP
            (2, 1)
        """
        return dp_identity(self.description.settings)

    def step_shape(self) -> StepShape:
        """The global step at this group's degree (``per_rank`` batches here, ``global_batches``
        over all ranks), from the options and a loaded state, whose G is kept
        (see :mod:`zephon_dask.state.steps`).

        Raises:
            ConfigError: the step settings make steps depend on the topology.
            StateError: they would change a loaded state's global step.

        Example:
            >>> pipeline.session.step_shape().per_rank  # batches per optimizer step here; doctest: +SKIP
            4
        """
        return shape_for(self.description, self.resume, self.identity()[0])

    # -- the runner ---------------------------------------------------------------------

    @property
    def started_runner(self):
        """The runner if one is running, else ``None`` (never starts one)."""
        return self._runner

    def runner(self):
        """The started runner for the pipeline's spec (started on first use, reused after)."""
        if self.closed:
            raise ClosedError("this pipeline is closed; build a new one (or use it in a `with` block "
                              "only once) instead of iterating it again from its start")
        spec = self.spec()
        if self._runner is not None and self._runner_fp != spec.fingerprint:  # a checkpoint's seed
            self._runner.close()
            self._runner = None
        if self._runner is None:
            self._runner = make_runner(spec, dict(self.description.settings))
            self._runner_fp = spec.fingerprint
        return self._runner

    # -- iterations -----------------------------------------------------------------------

    def open_stream(self, lanes: list[int], resume: State | None, first_lane: int | None = None,
                    shape: StepShape | None = None) -> BatchStream:
        """A new stream over ``lanes`` starting at ``resume`` (a state; ``None``: the beginning),
        stepping by ``shape`` (default: :meth:`step_shape`)."""
        start, _ = resume_point(resume, lanes)
        runner = self.runner()
        settings = ConsumerSettings.from_options(self.description.settings, runner, len(lanes))
        spec = self.spec()
        return BatchStream(spec, self.description.batch, lanes, runner, settings, start=start,
                           first_lane=first_lane, pass_end=self.pass_end(spec, lanes, shape or self.step_shape()))

    def pass_end(self, spec: PipelineSpec, lanes: list[int], shape: StepShape) -> PassEnd | None:
        """Where a pass over ``lanes`` ends with ``drop_last_step`` (``None``: at the end of the data).
        Its whole steps are known up front when every row is one sample (from the curriculum: the
        same at every DP degree); otherwise the stream finds them by looking ahead over its lanes."""
        if self.evaluation or not spec.drop_last_step or spec.source.num_chunks is None:
            return None
        lane = steps.per_lane(shape, spec.canonical_replicas)
        if not one_to_one(spec.record_ops, spec.accumulators):
            return PassEnd(lane, shape.per_rank)
        rows = known_rows(spec)
        assert rows is not None
        batch = self.description.batch
        whole = steps.whole_steps(rows, batch.microbatch_size, lane)
        return PassEnd(lane, shape.per_rank, whole, sum(
            steps.lane_batches(rows[i], batch.microbatch_size, batch.drop_last) - whole * lane for i in lanes))

    def serve_evaluation(self) -> None:
        """Serve every later iteration to an evaluation: every sample, each pass to the end of its
        data. ``drop_last_step`` shapes optimizer steps, which an evaluation does not take; the
        framework integrations call this for their evaluation pipelines."""
        self.evaluation = True

    def needs_vote(self, end: PassEnd | None) -> bool:
        """Whether the DP groups must vote on where a pass ending at ``end`` ends: it is found by
        looking ahead (packed or filtered rows) and several groups share the lanes."""
        return end is not None and end.steps is None and self.identity()[0] > 1

    def open_voting(self, stream: BatchStream, progress: Progress) -> None:
        """Give ``stream`` (served to training in this process) the groups' vote, or mark that none
        can be held (no ``torch.distributed``), which it says when the pass ends."""
        stream.agreement, stream.unagreed = self.voting(stream.pass_end, progress)

    def voting(self, end: PassEnd | None, progress: Progress) -> tuple[StepAgreement | None, bool]:
        """``(agreement, unagreed)`` for the process that serves the group's batches to training:
        the DP groups' vote on each step of ``progress``'s iteration when the pass ends on its last
        whole step and only looking ahead finds it (packed or filtered rows), with several groups
        under ``torch.distributed``, else ``None``; ``unagreed``: a vote was needed and none can be
        held (each group then ends on its own lanes' last whole step, and says so where it ends)."""
        if not self.needs_vote(end):
            return None, False
        if torch_dist.initialized(several=True) is None:
            return None, True
        per_rank = progress.shape.per_rank
        return StepAgreement(torch_dist.every_rank, per_rank, progress.delivered % per_rank), False

    def next_start(self, lanes: list[int]) -> State | None:
        """Where the next iteration over ``lanes`` starts (``None``: the stream's beginning).

        A loaded state applies once, to the next iteration. Every other
        iteration starts a new pass over the stream (every lane at its
        beginning; the global step goes on from the last iteration's, see
        :func:`~zephon_dask.state.progress.pass_start`), whether the last
        one ran to the end of the stream or was left before it.
        """
        if self.pending and self.resume is not None:
            check_covers(self.resume, lanes)
            return self.resume
        return self.progress.next_pass() if self.progress is not None else None

    def begin(self) -> tuple[Progress, int]:
        """Start a new iteration over the group's lanes (at :meth:`next_start`); it supersedes
        any older one, whose ledger file is closed. Returns its progress and generation."""
        lanes = owned_lanes(self.description.settings)
        start = self.next_start(lanes)
        shape = self.step_shape()
        self.end_iteration()
        ledger = self.description.settings["ledger"]
        writer = LedgerWriter(ledger, process_rank(self.description.settings)) if ledger is not None else None
        self.progress = Progress(self.spec(), lanes, start, shape, writer)
        self.start, self.from_loaded, self.pending = start, self.pending, False
        self.handed_out = False
        return self.progress, self.generation

    def iterate(self, open_items: Callable[[Progress], Iterator], observe: bool) -> Iterator:
        """Begin an iteration now and yield the items ``open_items(progress)`` gives while it is
        live, recording each with ``progress.observe_batch`` as the caller receives it if ``observe``
        (else ``open_items`` records them).

        An iteration that starts at a loaded state with nothing left (a state
        taken after the pass's last batch, on every lane of the state:
        :meth:`pass_over`) goes on into the next pass, as the uninterrupted
        run's next iteration would: a framework that starts an epoch there
        gets batches, not an empty epoch that ends its training.
        """
        progress, generation = self.begin()
        return self._serve(open_items, open_items(progress), progress, generation, observe, self.from_loaded)

    def _serve(self, open_items, items, progress: Progress, generation: int, observe: bool, chain: bool):
        served = False
        while True:
            self.check_live(generation)
            item = next(items, _END)
            if item is _END:
                if served or not chain or not self.pass_over(self.start, progress.lanes):
                    return
                chain = False
                progress, generation = self.begin()  # the next pass
                items = open_items(progress)
                continue
            if observe:
                progress.observe_batch(item)
            served = True
            yield item

    def pass_over(self, state: State | None, lanes: list[int]) -> bool:
        """Whether no lane of ``state`` has a batch left in its pass, given that ``lanes`` have
        none. A state merged from several DP groups holds other groups' lanes too: while one of
        them owes batches of this pass, the pass goes on there, and this group's next pass waits
        for the next iteration, as in the uninterrupted run."""
        if state is None:
            return True
        others = [lane for lane in sorted(state.lanes) if lane not in lanes]
        if not others:
            return True
        spec = self.spec()
        if self.pass_end(spec, lanes, self.step_shape()) is not None:  # the lanes step together
            return not behind(state, others)
        open_ = [lane for lane in others if not state.lanes[lane].finished
                 and ((n := spec.num_windows(lane)) is None or state.lanes[lane].window < n)]
        if not open_:
            return True
        stream = self.open_stream(open_, state)  # each lane ends where its data does: look
        try:
            return next(stream, None) is None
        except EmptyStreamError:
            return True
        finally:
            stream.close()

    def tracked_stream(self, progress: Progress) -> BatchStream:
        """The stream of the iteration ``progress`` tracks; lanes that end report to it."""
        if self.stream is not None:
            self.stream.close()
        self.stream = self.open_stream(progress.lanes, self.start, progress.first_lane, progress.shape)
        self.stream.on_finish = progress.lane_finished
        self.open_voting(self.stream, progress)
        return self.stream

    def end_iteration(self) -> None:
        """Supersede the current iteration (its iterator raises if used again)."""
        self.generation += 1
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.progress is not None:
            self.progress.close()

    def check_live(self, generation: int) -> None:
        """Raise :class:`StateError` if the iteration ``generation`` was superseded."""
        if generation != self.generation:
            raise StateError(SUPERSEDED)

    def current_progress(self) -> Progress:
        """The current (or last) iteration's progress; before the first, where one would start."""
        if self.progress is not None:
            return self.progress
        return Progress(self.spec(), owned_lanes(self.description.settings), self.resume if self.pending else self.start,
                        self.step_shape())

    def hand_out(self) -> None:
        """A DataLoader now serves this session's data out of sight (``to_torch_dataset()``):
        :meth:`state_dict` raises until the next iteration here."""
        self.handed_out = True

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self, ahead: int | None = None, at_step: int | None = None) -> dict:
        """What the iteration delivered (see ``Pipeline.state_dict``)."""
        if self.handed_out:
            raise StateError(HANDED_OUT)
        return self.current_progress().state(ahead, at_step)

    def mark_consumed(self, upto) -> None:
        """The training step consumed deliveries up to ``upto``; :meth:`state_dict` then leaves out
        those fetched after it.

        Args:
            upto: a delivered :class:`~zephon_dask.Batch`, or a count of this
                iteration's deliveries.

        Raises:
            StateError: no iteration is in progress, or ``upto`` is not among its
                recent deliveries.

        Example:
            >>> pipeline.session.mark_consumed(batch)  # doctest: +SKIP
        """
        if self.progress is None:
            raise StateError("mark_consumed() needs an iteration in progress; iterate the pipeline first")
        self.progress.mark_consumed(upto)

    def load(self, state: State, source) -> None:
        """Make ``state`` (checked) where the next iteration starts, with ``source`` (the
        state's seed); its G holds for the session."""
        self.end_iteration()
        self.use_source(source)
        self.resume = state
        self.pending = True
        self.progress = None
        self.handed_out = False

    def close(self) -> None:
        """Stop the iteration and the runner this session started. Bounded: the runner's close
        waits for no cluster start and bounds each step; each part is closed even if one before
        it fails."""
        self.closed = True
        stream, runner = self.stream, self._runner
        self._runner = None  # the closed stream stays: stats() still reads its counters
        try:
            if stream is not None:
                stream.close()
        finally:
            try:
                if runner is not None:
                    runner.close()
            finally:
                if self.progress is not None:
                    self.progress.close()

    def __del__(self):
        """Close once unreachable (the pipeline and every iterator over it gone); best effort."""
        try:
            self.close()
        except Exception:  # interpreter shutdown, or a half-built object
            pass

    def __getstate__(self) -> dict:
        """A copy for another process (a DataLoader worker): the description, the loaded state
        and where the iteration started, without the runner, the stream or the progress of this
        process."""
        state = dict(self.__dict__)
        state.update(_runner=None, _runner_fp=None, stream=None, progress=None)
        return state

