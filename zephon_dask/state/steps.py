"""The global-step contract. Pure.

A global step holds G batches over all DP groups: ``G / dp_degree`` per
rank, G a multiple of ``canonical_replicas`` (R), so every step is whole
round-robin cycles over the lanes and holds the same batches at every
degree. G is a data setting: set it with ``global_batches_per_step=G`` (or
per rank with ``batches_per_step=n``, G = n x dp_degree); unset, it is R.
A loaded state records G, and a resume keeps it: a resume on degree d takes
G / d batches per rank, and a setting that would change G is refused.
Lanes advance by samples, so what a resume really keeps is the samples per
global step (G x microbatch size): with another microbatch size, G scales.

A pass over a finite stream ends on a whole global step (``drop_last_step``, a
data option, on by default): the steps every lane completes (:func:`whole_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..curriculum.routing import check_step
from ..errors import ConfigError, StateError
from ..validate import check_int
from .schema import describe_diff


@dataclass(frozen=True)
class StepShape:
    """A global step: ``global_batches`` (G) over all ranks, ``per_rank`` = G / ``dp_degree`` here.

    ``explicit`` says G was set by an option (else it is the default, one
    cycle); ``microbatch`` is the samples per batch (recorded with G);
    ``warns_mid_step`` says a state taken mid-step warns, whatever set G
    (False only for a DataLoader worker's share, whose loader counts the steps).
    """

    per_rank: int
    global_batches: int
    dp_degree: int
    explicit: bool
    microbatch: int = 1
    warns_mid_step: bool = True


def valid_degrees(replicas: int, global_batches: int) -> list[int]:
    """The DP degrees a run with R lanes and G batches per global step can use."""
    return [d for d in range(1, replicas + 1) if replicas % d == 0 and global_batches % d == 0]


def check_global(global_batches: object, replicas: int) -> int:
    """Validate G: a positive multiple of R."""
    g = check_int(global_batches, "global_batches_per_step", 1,
                  hint=f"a multiple of canonical_replicas={replicas}, e.g. {replicas}")
    if g % replicas:
        raise ConfigError(
            f"global_batches_per_step={g!r} must be a positive multiple of canonical_replicas="
            f"{replicas}, so that every global step is whole round-robin cycles over the lanes "
            f"(the nearest is {-(-g // replicas) * replicas})"
        )
    return g


def _check_degree(global_batches: int, degree: int, replicas: int, what: str, error=ConfigError) -> None:
    if replicas % degree or global_batches % degree:
        raise error(
            f"dp_degree={degree} cannot take {what} ({global_batches} batches per global step over "
            f"canonical_replicas={replicas} lanes): it must divide both. Valid degrees: "
            f"{valid_degrees(replicas, global_batches)}"
        )


def _rescale(saved: int, saved_microbatch: int, microbatch: int, replicas: int) -> int:
    """A checkpoint's G in batches of ``microbatch`` samples (``saved_microbatch`` 0: unknown, v1)."""
    if not saved_microbatch or saved_microbatch == microbatch:
        return saved
    samples = saved * saved_microbatch
    if samples % microbatch or (samples // microbatch) % replicas:
        good = [m for m in range(1, min(samples, 1024) + 1)  # bounded: a forged state may be huge
                if samples % m == 0 and (samples // m) % replicas == 0]
        raise StateError(
            f"the checkpoint's global step holds {samples} samples ({saved} batches of "
            f"{saved_microbatch}); with microbatch_size={microbatch} that is not a whole number of "
            f"round-robin cycles over {replicas} lanes. Use a microbatch size in {good}"
        )
    return samples // microbatch


def step_shape(replicas: int, degree: int, owned: int, per_rank: int | None,
               global_batches: int | None, saved: int | None, microbatch: int = 1,
               saved_microbatch: int = 0) -> StepShape:
    """The step at ``degree`` from the options (``per_rank``, ``global_batches``) and a loaded
    state's G (``saved``, in batches of ``saved_microbatch`` samples); ``owned`` is how many
    lanes this group owns.

    Raises :class:`ConfigError` for settings that make steps depend on the
    topology, :class:`StateError` when they would change a loaded state's G.
    """
    if per_rank is not None:
        implied = per_rank * degree
        if global_batches is not None and implied != global_batches:
            raise ConfigError(
                f"batches_per_step={per_rank} x dp_degree={degree} = {implied} contradicts "
                f"global_batches_per_step={global_batches}; set one of them"
            )
        if saved is None:
            check_step(per_rank, degree, replicas)
        global_batches = implied
    if global_batches is not None and saved is None:
        check_global(global_batches, replicas)
    if saved is not None:
        saved = _rescale(saved, saved_microbatch, microbatch, replicas)
        if global_batches is not None and global_batches != saved:
            setting = (f"batches_per_step={per_rank} x dp_degree={degree}" if per_rank is not None
                       else f"global_batches_per_step={global_batches}")
            fix = (f"batches_per_step={saved // degree}" if saved % degree == 0 and replicas % degree == 0
                   else f"a dp_degree in {valid_degrees(replicas, saved)}")
            raise StateError(
                "the resume would change the number of batches in a global step, and so every later "
                "step:\n" + describe_diff([("step.global_batches", saved, global_batches)])
                + f"\n({setting}). Drop the setting (a resume derives it from the checkpoint), "
                f"or use {fix}"
            )
        _check_degree(saved, degree, replicas, "the checkpoint's steps", StateError)
        return StepShape(saved // degree, saved, degree, per_rank is not None or global_batches is not None,
                         microbatch)
    if global_batches is not None:
        _check_degree(global_batches, degree, replicas, f"global_batches_per_step={global_batches}")
        return StepShape(global_batches // degree, global_batches, degree, True, microbatch)
    if replicas % degree:  # uneven groups (warned): one cycle over the owned lanes, no elastic steps
        return StepShape(owned, replicas, degree, False, microbatch)
    return StepShape(replicas // degree, replicas, degree, False, microbatch)


def describe(shape: StepShape, replicas: int) -> str:
    """One line for ``explain`` and the CLI."""
    cycles = shape.global_batches // replicas if shape.global_batches % replicas == 0 else None
    text = (f"{shape.global_batches} batches per global step, {shape.per_rank} per rank at "
            f"dp_degree={shape.dp_degree}")
    if cycles is not None:
        text += f" ({cycles} round-robin cycle{'s' if cycles != 1 else ''} over {replicas} lanes)"
    return text + ("" if shape.explicit else "; default: one cycle (set global_batches_per_step)")


# -- the end of a pass ---------------------------------------------------------------------
# With drop_last_step (the default), a pass over a finite stream ends on a whole global step.
# A global step holds G / R full batches of every lane (whole round-robin cycles), so the whole
# steps of a pass are those every lane completes, the same at every DP degree and worker count
# and, counted in samples, at every microbatch size that keeps G x microbatch; each lane's batches
# after them (a last partial one kept by drop_last=False among them) are dropped.

def per_lane(shape: StepShape, replicas: int) -> int:
    """Batches of each lane in one global step (G / R)."""
    return shape.global_batches // replicas


def lane_batches(rows: int, microbatch: int, drop_last: bool) -> int:
    """Batches a lane of ``rows`` samples gives (its last partial one kept unless ``drop_last``)."""
    return rows // microbatch if drop_last else -(-rows // microbatch)


def whole_steps(rows: Sequence[int], microbatch: int, per_lane: int) -> int:
    """The global steps a pass gives when it ends on a whole step: lanes of ``rows`` samples each,
    ``per_lane`` full batches of ``microbatch`` samples of every lane in a step."""
    return min(n // (microbatch * per_lane) for n in rows)
