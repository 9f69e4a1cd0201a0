"""Mixture schedules in a pipeline: global steps -> chunk blocks.

Pure functions of the data config; measuring rows per sample (below) reads one
window of data per phase, and its results are cached by fingerprint.

A schedule phase starts at a **chunk block** (``R = canonical_replicas``
consecutive chunks, one per lane), so every lane switches at the same point of
its own stream. A start given in global steps is converted here:

* a global step takes ``G x microbatch / R`` rows from each lane (G batches
  per step; the samples per step are kept by every resume);
* when every row is one sample of the mixture (no ``filter``, ``pack``,
  ``stateful`` or ``tokenize(split_long=True)``), ``rows_per_sample`` is 1;
  otherwise it is **measured** for each phase: the rows that lane 0's first
  window gives under the phase's weights alone, over the samples it reads (a
  deterministic estimate, computed once per phase);
* phase ``p`` starts at lane sample ``S_p = S_{p-1} + (s_p - T_{p-1}) x rows
  per lane-step / rows_per_sample_{p-1}``, rounded to the nearest whole chunk
  block (halves up): chunk ``R x round(S_p / chunk_size)``; ``T_{p-1}`` is the
  global step where phase ``p - 1`` begins (after its own rounding).

The resolved chunk starts enter the data config (and so every checkpoint), and a
resume takes them from the checkpoint: they are never recomputed for a phase the
checkpoint knows. What a resume may change is decided with the other resume checks
(:func:`zephon_dask.pipeline.resume.reconcile`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from ..curriculum import MixtureWorkSource
from ..errors import ConfigError
from ..operators.base import one_to_one
from .spec import PipelineSpec
from .window import compute_window


@dataclass(frozen=True)
class PhasePlan:
    """Where one phase begins: requested (step, when given in steps), resolved chunk and block,
    and the global step where it begins (``exact`` when rows are samples and nothing reorders
    them; otherwise an estimate), and the phase's measured rows per sample (``None`` for the
    last phase, which no later start depends on)."""

    phase: int
    step: int | None
    chunk: int
    block: int
    begin_step: Fraction | None
    exact: bool
    rows_per_sample: Fraction | None


_MEASURED: dict[str, Fraction] = {}  # phase spec fingerprint -> rows per sample (a cache of pure values)


def rows_per_sample(spec: PipelineSpec, p: int) -> Fraction:
    """Rows per mixture sample under phase ``p`` of ``spec.source``: 1 for a one-to-one pipeline,
    else measured on lane 0's first window (deterministic: a pure function of the data config;
    cached)."""
    if one_to_one(spec.record_ops, spec.accumulators):
        return Fraction(1)
    source = spec.source
    spec = replace(spec, source=source.phase_source(p))
    if spec.fingerprint in _MEASURED:
        return _MEASURED[spec.fingerprint]
    out = compute_window(spec, 0, 0)
    read = len(out.chunks) * source.chunk_size
    if len(out) == 0:
        raise ConfigError(
            f"schedule phase {p}: lane 0's first window gives no rows, so its steps cannot be converted "
            "into chunks; give the schedule in chunks (schedule_unit='chunk')")
    if len(_MEASURED) > 256:
        _MEASURED.clear()
    _MEASURED[spec.fingerprint] = Fraction(len(out), read)
    return _MEASURED[spec.fingerprint]


def _round(x: Fraction) -> int:
    return int((2 * x + 1) // 2)  # nearest, halves up


def plan(spec: PipelineSpec, global_batches: int, microbatch: int, known: dict[int, int] | None = None,
         estimate: bool = False) -> list[PhasePlan]:
    """Each phase's resolved start in ``spec.source``; ``known`` maps phases to chunk starts already fixed (from a
    checkpoint), which are kept. Rows per sample are measured only where a step start needs
    converting, or for every phase with ``estimate`` (then every ``begin_step`` is set).
    Raises :class:`ConfigError` for chunk starts that are not whole blocks, or step starts too
    close to share a block."""
    source, replicas = spec.source, spec.canonical_replicas
    assert source.phases is not None
    known = known or {}
    q = Fraction(global_batches * microbatch, replicas)  # rows one lane gives per global step
    exact = one_to_one(spec.record_ops, spec.accumulators) and not spec.accumulators
    cs = source.chunk_size
    plans: list[PhasePlan] = [PhasePlan(0, 0 if source.schedule_unit == "step" else None, 0, 0,
                                        Fraction(0), exact, None)]
    samples = Fraction(0)  # S_{p-1}: lane samples before the previous phase
    begin: Fraction | None = Fraction(0)  # T_{p-1}: the global step where the previous phase begins
    converted = [p for p in range(1, len(source.phases)) if source.schedule_unit == "step" and p not in known]
    last = len(source.phases) - 1 if estimate else max(converted, default=0)  # measure phases before it
    for p in range(1, len(source.phases)):
        phase, prev = source.phases[p], source.phases[p - 1]
        step = phase.start if source.schedule_unit == "step" else None
        rho = rows_per_sample(spec, p - 1) if p <= last else None
        if p in known:
            chunk = known[p]
        elif step is None:
            chunk = phase.start
        else:
            assert rho is not None and begin is not None and step is not None
            target = samples + (step - begin) * q / rho
            chunk = _round(target / cs) * replicas
        if chunk % replicas:
            raise ConfigError(
                f"schedule phase {p} starts at chunk {chunk}, not a whole block of canonical_replicas="
                f"{replicas} chunks, so lanes would switch at different points; use chunk "
                f"{chunk // replicas * replicas} or {(chunk // replicas + 1) * replicas}")
        if chunk <= plans[-1].chunk:
            raise ConfigError(
                f"schedule phases {p - 1} and {p} (starts {prev.start} and {phase.start} "
                f"{source.schedule_unit}s) land on the same chunk block {plans[-1].block}: a block is "
                f"about {float(cs / q * (rho or 1)):.4g} global steps here; space the phases further apart")
        block = chunk // replicas
        begin = None if rho is None or begin is None else begin + (block * cs - samples) * rho / q
        samples = Fraction(block * cs)
        plans[-1] = replace(plans[-1], rows_per_sample=rho)
        plans.append(PhasePlan(p, step, chunk, block, begin, exact, None))
    return plans


def resolve(spec: PipelineSpec, global_batches: int, microbatch: int,
            known: dict[int, int] | None = None) -> MixtureWorkSource:
    """``spec.source`` with every phase start a chunk block (itself when it needs no conversion)."""
    source = spec.source
    if source.phases is None:
        return source
    plans = plan(spec, global_batches, microbatch, known)
    if source.schedule_unit == "chunk":
        return source
    return source.with_phase_chunks([pl.chunk for pl in plans])
