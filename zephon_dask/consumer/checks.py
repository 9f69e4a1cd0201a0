"""Data lost or ignored silently, caught from what a fresh stream's windows report. Pure apart
from the warnings it gives.

A stream starting at the beginning checks its first window that read records
(:func:`check_first_window`): a dataset whose records were read there but of
which no sample is left (a ``.filter`` or ``.map`` dropping all of it, so the
mixture delivers the other datasets only) is a :class:`ZephonWarning` naming it
and the window's drop counters; a record operator with a ``check_first_window``
method checks the window's counters itself (``tokenize_chat``: not one trained
token). A fresh stream that ends without a single sample although it read
records raises :func:`empty_stream` (a filter that drops everything). Only a
fresh stream checks, so a resumed run behaves as the uninterrupted one did.
Deterministic: everything comes from the window's counters and lineage and
from the pure chunk mapping.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from ..core.spec import PipelineSpec
from ..core.window import WindowOutput
from ..curriculum.chunking import choose_chunk_size, stream_chunks
from ..errors import ElasticityWarning, EmptyStreamError, ZephonWarning

MIN_RECORDS = 8  # records of a dataset read in the first window before its absence is worth a warning


def _dropped(stats: Mapping[str, int]) -> dict[str, int]:
    return {k: n for k, n in sorted(stats.items()) if k.endswith(".dropped") or k.endswith("_tokens")}


def check_first_window(spec: PipelineSpec, lane: int, window: int, out: WindowOutput) -> None:
    """Warn for each dataset that contributes nothing to the window although at least
    :data:`MIN_RECORDS` of its records were read there; run the record operators' own checks."""
    where = f"lane {lane}, window {window}"
    lanes_note = idle_lanes(spec.source, spec.canonical_replicas)
    if lanes_note is not None:
        warnings.warn(lanes_note, ElasticityWarning, stacklevel=2)
    names = spec.source.names
    if len(names) > 1:
        read = np.zeros(len(names), np.int64)
        for g in out.chunks:
            read += spec.source.chunk_counts(g)  # no record located: this runs before the first batch
        kept = np.bincount(out.table.lineage[:, 0], minlength=len(names))
        for d in np.flatnonzero((read >= MIN_RECORDS) & (kept == 0)).tolist():
            warnings.warn(
                f"dataset {names[d]!r} contributes nothing to the first window ({where}): "
                f"{int(read[d])} of its records were read there and no sample is left of them "
                f"(the window's counters: {_dropped(out.stats)}). If a .filter or .map drops all of "
                f"{names[d]!r}, the mixture delivers the other datasets only; check the operators "
                "on pipeline.preview()",
                ZephonWarning,
                stacklevel=2,
            )
    for op in spec.record_ops:
        check = getattr(op, "check_first_window", None)
        if check is not None:
            check(out.stats, len(out), where)


def check_mixture_drift(spec: PipelineSpec, lane: int, window: int, out: WindowOutput) -> bool:
    """Warn when an accumulator's ``drift_warning(stats)`` (``ensure_mixture`` with a
    ``warn_tolerance``) finds this window's delivered share too far from its target; whether it warned."""
    for op in spec.accumulators:
        check = getattr(op, "drift_warning", None)
        message = check(out.stats) if check is not None else None
        if message:
            warnings.warn(f"{op.name}: lane {lane}, window {window} {message}", ZephonWarning, stacklevel=2)
            return True
    return False


def empty_stream(stats: Mapping[str, int], what: str) -> EmptyStreamError:
    """The error for ``what`` (a stream, or a run of windows) that read records and gave no sample."""
    return EmptyStreamError(
        f"{what} gave no sample although {stats.get('records', 0):,} records were read (counters: "
        f"{_dropped(stats)}): a .filter or .map drops every record, or the documents are too "
        "short for what follows (pack's dropped tokens). Check the operators on pipeline.preview()"
    )


def idle_lanes(source, replicas: int) -> str | None:
    """What to say when the stream has fewer chunks than lanes, so lanes get no data and a few
    lanes carry every batch, with the fix: the chunk size a pipeline chooses from the data
    (:func:`~zephon_dask.curriculum.chunking.choose_chunk_size`), or fewer lanes where no chunk
    size gives every lane a chunk; ``None`` when every lane has one, or the stream never ends. Pure."""
    chunks = source.num_chunks
    if chunks is None or chunks >= replicas:
        return None
    samples = sum(source.sizes)
    said = (f"the stream has {chunks} chunk{'s' if chunks != 1 else ''} of {source.chunk_size:,} samples "
            f"for {replicas} lanes: {replicas - chunks} lanes get no chunk and the batches come from "
            f"{chunks} lane{'s' if chunks != 1 else ''} only. ")
    fit = choose_chunk_size(source, replicas) if source.phases is None else None
    most = stream_chunks(source, fit) if fit is not None else None
    if fit is not None and most is not None and most >= replicas:
        return (said + f"For a corpus of {samples:,} samples pass MixtureWorkSource(..., chunk_size={fit}) "
                "(or leave chunk_size out: a pipeline then chooses it), or lower canonical_replicas; "
                "both change the data, so choose before training")
    if fit is not None and most:
        return (said + f"No chunk size gives {samples:,} samples {replicas} lanes: lower canonical_replicas "
                f"to {most} or less (with chunk_size={fit}), or add data")
    fit = max(1, 1 << max(0, (samples // replicas).bit_length() - 1)) if samples >= replicas else 1
    return (said + f"For a corpus of {samples:,} samples pass MixtureWorkSource(..., chunk_size={fit}) "
            "(or lower canonical_replicas); both change the data, so choose before training")
