"""Resuming from a checkpoint: every check a state meets before an iteration starts there. Pure
(it changes no pipeline; the caller installs what :func:`check` returns).

:func:`check` is the one entry point (``Pipeline.load_state_dict``, a
DataLoader dataset's ``load_state_dict`` and a derived pipeline whose data
changed all call it). In order it:

1. validates and migrates the dict (:meth:`State.from_dict`);
2. refuses another ``canonical_replicas``;
3. builds the work source to resume with: the checkpoint's seed, its tokens
   per sample (``weight_by="tokens"``: the measurement is reused, never
   redone), its chunk size where the source leaves it open (the choice is
   reused, never redone), its schedule's phase starts (:func:`reconcile`: what a resume may
   change in a mixture schedule);
4. refuses another data config (the difference is listed) or a fingerprint
   that does not match the checkpoint's own config;
5. refuses a state missing one of the lanes to serve, or lane positions the
   stream cannot have produced;
6. refuses settings that would change the checkpoint's global step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ..core import phases
from ..core.spec import PipelineSpec
from ..curriculum import MixtureWorkSource
from ..curriculum.chunking import fitted
from ..errors import ConfigError, StateError, ZephonWarning, user_stacklevel
from ..log import logger
from ..operators.identity import sha256_json
from ..state import steps
from ..state.schema import State, config_diff, describe_diff, pointer_key
from ..state.steps import StepShape
from .ranks import dp_identity, owned_lanes


@dataclass(frozen=True)
class Resume:
    """A checked resume: the state, the work source to resume with, the global step it keeps."""

    state: State
    source: MixtureWorkSource
    shape: StepShape


def check(session, state: Any, lanes: list[int] | None = None, *, announce: bool = False) -> Resume:
    """``state`` checked for resuming ``lanes`` (default: the group's) of the data ``session`` runs.

    Args:
        session: the :class:`~zephon_dask.pipeline.session.Session` to resume (its description
            and work source as built).
        state: a state dict (any version) or a :class:`~zephon_dask.state.State`.
        lanes: the lanes the state must cover.
        announce: (a user's ``load_state_dict``) warn, at the user's call, where the
            checkpoint's seed or tokens per sample override the pipeline's or a mid-step state
            resumes on another topology, and log the resume point.

    Returns:
        A :class:`Resume`.

    Raises:
        StateError: the state is malformed, belongs to other data, lacks a lane, holds
            impossible positions, or the settings would change its global step.
    """
    state = State.from_dict(state)
    d = session.description
    lanes = owned_lanes(d.settings) if lanes is None else lanes
    degree = dp_identity(d.settings)[0]
    _check_replicas(state, d.settings["canonical_replicas"])
    source, scheduled = _work_source(session, state, degree)
    spec = PipelineSpec.of(source, d.record_ops, d.accumulators, d.settings, d.batch_ops)
    _check_config(state, spec.config(), scheduled)
    check_covers(state, lanes)
    check_positions(spec, state)
    shape = shape_for(d, state, degree)  # refuses a setting that would change the state's G
    if announce:
        _announce(session.source, state, source, lanes)
    return Resume(state, source, shape)


def shape_for(description, state: State | None, degree: int) -> StepShape:
    """The global step at ``degree`` for a resume from ``state`` (``None``: a fresh start) of a
    pipeline with ``description`` (its :class:`~.description.Description`).

    Raises:
        ConfigError: the step settings make steps depend on the topology.
        StateError: they would change the state's global step.
    """
    settings = description.settings
    saved = state.step if state is not None else None
    with warnings.catch_warnings():  # uneven groups are warned where the lanes are served, after a bad step
        warnings.simplefilter("ignore", ZephonWarning)
        owned = len(owned_lanes(settings))
    return steps.step_shape(settings["canonical_replicas"], degree, owned,
                            settings["batches_per_step"], settings["global_batches_per_step"],
                            saved.global_batches if saved is not None else None, description.batch.microbatch_size,
                            saved.microbatch_size if saved is not None else 0)


def _check_replicas(state: State, replicas: int) -> None:
    saved = state.config.get("canonical_replicas")
    if saved != replicas:
        raise StateError(
            f"the checkpoint was written with canonical_replicas={saved} but this pipeline has "
            f"canonical_replicas={replicas}; lanes are fixed for a run's "
            f"lifetime: set .options(canonical_replicas={saved})"
        )


def _work_source(session, state: State, degree: int) -> tuple[MixtureWorkSource, bool]:
    """The work source to resume with (see the module docstring, step 3), and whether either
    side has a schedule (its phases are then compared by :func:`reconcile`)."""
    saved = state.config.get("source", {})
    source = session.built_source
    seed = saved.get("seed")
    if isinstance(seed, int) and seed != source.seed:
        source = source.with_seed(seed)
    source = _checkpoint_measurement(source, saved)  # before the phases: they may measure
    source = _checkpoint_chunk_size(source, saved, session.description.settings["canonical_replicas"])
    scheduled = source.phases is not None or "schedule" in saved
    if scheduled and not source.unmeasured:  # the phases by the schedule's rules, the rest as below
        d = session.description
        shape = shape_for(d, state, degree)
        spec = PipelineSpec.of(source, d.record_ops, d.accumulators, d.settings, d.batch_ops)
        source = reconcile(saved, state, spec, shape.global_batches, d.batch.microbatch_size)
    return source, scheduled


def _checkpoint_measurement(source: MixtureWorkSource, saved: dict) -> MixtureWorkSource:
    """``source`` with the tokens per sample ``saved`` (a checkpoint's source config) holds, if
    both weigh by tokens; else ``source`` (a different ``weight_by`` shows in the config diff)."""
    numbers = saved.get("tokens_per_sample")
    if source.weight_by != "tokens" or saved.get("weight_by") != "tokens" or not isinstance(numbers, dict):
        return source
    try:
        return source.with_tokens_per_sample(numbers)
    except ConfigError as exc:
        raise StateError(f"the checkpoint's tokens_per_sample {numbers!r} do not fit this pipeline's "
                         f"datasets: {exc}") from None


def _checkpoint_chunk_size(source: MixtureWorkSource, saved: dict, replicas: int) -> MixtureWorkSource:
    """``source`` with the chunk size ``saved`` (a checkpoint's source config) holds if ``source``
    leaves it open (the choice is reused, never redone), else as a fresh run chooses it; one the
    data cannot take is chosen afresh, and the config diff shows the change."""
    size = saved.get("chunk_size")
    if source.chooses_chunk_size and not source.unmeasured and isinstance(size, int) and not isinstance(size, bool):
        try:
            return source.with_chunk_size(size)
        except ConfigError:
            pass
    return fitted(source, replicas)


def _check_config(state: State, current: dict, scheduled: bool) -> None:
    """Refuse a state of another data config (weights and schedule aside when ``scheduled``:
    :func:`reconcile` compared them), or whose fingerprint is not its config's."""
    saved = state.config
    diff = config_diff(_unscheduled(saved) if scheduled else saved,
                       _unscheduled(current) if scheduled else current)
    if diff:
        raise StateError("the checkpoint was written by a different data configuration:\n"
                         + describe_diff(diff))
    if sha256_json(saved) != state.fingerprint:
        raise StateError(f"the checkpoint's fingerprint {state.fingerprint[:16]} does not match its "
                         f"own config ({sha256_json(saved)[:16]}): the file was edited or corrupted")


def _unscheduled(config: dict) -> dict:
    """A data config without its mixture weights and schedule (compared by :func:`reconcile`)."""
    source = {k: v for k, v in config.get("source", {}).items() if k not in ("weights", "schedule")}
    return {**config, "source": source}


def check_covers(state: State, lanes: list[int]) -> None:
    """Refuse a state without progress for every lane in ``lanes`` (a single rank's state)."""
    missing = [lane for lane in lanes if lane not in state.lanes]
    if missing:
        raise StateError(
            f"the state has no progress for lanes {missing}, which this group owns: a rank's "
            "state holds only its own lanes. Resume from the merged state of all ranks "
            "(zephon_dask.gather_state(pipeline), or zephon_dask.merge_states(states))"
        )


def check_positions(spec: PipelineSpec, state: State) -> None:
    """Refuse lane progress the stream cannot have produced (beyond its end, or inconsistent)."""
    for lane, p in sorted(state.lanes.items()):
        where = f"the state's lane {lane} ({p.to_dict()})"
        if lane >= spec.canonical_replicas:
            raise StateError(f"{where} is beyond canonical_replicas={spec.canonical_replicas}: "
                             "the state is corrupted or from another run")
        n = spec.num_windows(lane)
        if n is None and p.finished:
            raise StateError(f"{where} says the lane finished, but this stream never ends "
                             "(exhausted_policy='repeat'): the state is corrupted")
        if n is not None and (p.window > n or (p.window == n and p.offset)):
            raise StateError(f"{where} lies beyond the lane's last window ({n - 1}): the state is "
                             "corrupted or from longer data")
        if (p.batches_delivered == 0) != (p.window == 0 and p.offset == 0) and not p.finished:
            raise StateError(f"{where}: a lane's position moves exactly when it has delivered a "
                             "batch; the state is corrupted")


def _announce(base: MixtureWorkSource, state: State, source: MixtureWorkSource, lanes: list[int]) -> None:
    """Warn where the checkpoint's seed or tokens per sample override the pipeline's (``base``:
    its session's source), or where a state taken mid-step resumes on another topology (its
    round-robin pointer is not these lanes'); log where the resume starts."""
    if source.seed != base.seed:
        warnings.warn(f"resuming with the checkpoint's seed {source.seed}, not this pipeline's seed "
                      f"{base.seed}", ZephonWarning, stacklevel=user_stacklevel())
    used = dict(zip(source.names, source.tokens_per_sample or (), strict=False))
    if any(used.get(n, v) != v for n, v in base.token_pins.items()):
        warnings.warn("resuming with the checkpoint's tokens_per_sample, not the ones this pipeline's "
                      "work source was given", ZephonWarning, stacklevel=user_stacklevel())
    step = state.step
    if step.batches_in_step and pointer_key(0, 1, lanes) not in state.pointers:
        warnings.warn(
            f"resuming a state taken {step.batches_in_step} batches into global step {step.global_step} "
            f"on another topology (lanes {','.join(map(str, lanes))} were not one group's when it was "
            "taken): the rest of that step may interleave its lanes differently, and so group later "
            "batches into steps differently; each lane's batches stay exact (nothing lost or "
            "repeated). Checkpoint at step boundaries to resume step for step",
            ZephonWarning, stacklevel=user_stacklevel())
    logger.info("resuming at global step %d: lane frontiers (window, offset) %s", state.step.global_step,
                {lane: (state.lanes[lane].window, state.lanes[lane].offset) for lane in lanes})


# -- a schedule: what a resume may change -----------------------------------------------

def _requests(source_config: dict) -> list[dict]:
    """A source config's phases as ``{"start", "chunk", "weights"}`` (a plain mixture: one phase)."""
    schedule = source_config.get("schedule")
    if schedule is None:
        return [{"start": None, "chunk": 0, "weights": source_config.get("weights")}]
    return [{"start": None if i == 0 else (("step", ph["step"]) if "step" in ph else ("chunk", ph["chunk"])),
             "chunk": ph["chunk"], "weights": ph["weights"]} for i, ph in enumerate(schedule)]


def frontier(state: State, k: int) -> int:
    """The chunk blocks a state's delivered samples come from: every block below this (a lane's
    ``j``-th chunk lies in block ``j``; a window begun counts whole, it is recomputed whole)."""
    return max((p.window * k + (k if p.offset else 0) for p in state.lanes.values()), default=0)


def _phase_diff(i: int, old: dict | None, new: dict | None) -> list[tuple[str, object, object]]:
    where = f"source.schedule[{i}]"
    if old is None or new is None:
        return [(where, "<absent>" if old is None else old, "<absent>" if new is None else new)]
    diff: list[tuple[str, object, object]] = []
    if old["start"] != new["start"]:
        diff.append((f"{where}.start", old["start"], new["start"]))
    for name in sorted(set(old["weights"]) | set(new["weights"])):
        a, b = old["weights"].get(name, "0/1"), new["weights"].get(name, "0/1")
        if a != b:
            diff.append((f"{where}.weights[{name}]", a, b))
    return diff


def reconcile(saved_source: dict, state: State, spec: PipelineSpec, global_batches: int,
              microbatch: int) -> MixtureWorkSource:
    """``spec.source`` resolved for a resume from ``state`` (whose source config is ``saved_source``).

    Phases the checkpoint has started (their first block lies below :func:`frontier`) must be
    unchanged, and keep the checkpoint's chunk starts; a phase the checkpoint knows, unchanged
    and with every earlier phase unchanged, keeps its chunk start too. New or edited phases
    must start at or after the frontier. Raises :class:`StateError` with the diff otherwise.
    """
    base, replicas, k = spec.source, spec.canonical_replicas, spec.flush_every_k_chunks
    old = _requests(saved_source)
    new = _requests({"weights": base.config()["weights"], **({"schedule": base.schedule_config()}
                                                             if base.phases is not None else {})})
    reached = frontier(state, k)
    started = [i for i, ph in enumerate(old) if i == 0 or ph["chunk"] // replicas < reached]
    diff = [d for i in started for d in _phase_diff(i, old[i], new[i] if i < len(new) else None)]
    if diff:
        raise StateError(
            "the schedule changes a phase this checkpoint has already started (its samples were "
            "delivered):\n" + describe_diff(diff) + f"\nKeep the started phases as they are; a phase "
            f"that starts after the checkpoint (chunk block {reached} or later) may be added or edited")
    known: dict[int, int] = {}
    for i in range(min(len(old), len(new))):
        if _phase_diff(i, old[i], new[i]):
            break
        known[i] = old[i]["chunk"]
    if base.phases is None:
        return base
    resolved = phases.resolve(spec, global_batches, microbatch, known)
    assert resolved.phase_chunks is not None
    for i, chunk in enumerate(resolved.phase_chunks):
        if i not in known and chunk // replicas < reached:
            raise StateError(
                f"schedule phase {i} would start at chunk block {chunk // replicas}, but this checkpoint "
                f"already delivered samples up to block {reached}: the delivered data would change. "
                "Start the phase later")
    return resolved
