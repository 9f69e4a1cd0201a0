"""Tokens per sample of each dataset, measured once for ``weight_by="tokens"``. Does I/O; pure.

A token-weighted :class:`~zephon_dask.curriculum.MixtureWorkSource` needs the
mean tokens per sample of each dataset to turn token shares into sample shares.
They are measured here on a fixed sample: for dataset ``c`` (in source order),
:data:`SAMPLE_SIZE` records (all of them for a smaller dataset) drawn without
replacement by a generator seeded with ``SeedSequence((seed, TAG, c))``, read and
run through the pipeline's own record operators (``map``, ``filter``,
``tokenize``, ... in chain order; no accumulator). The mean is exact: tokens out
over records in, so a filter's dropped records count as zero tokens, as they
do in training.

Datasets whose tokens per sample are given (``tokens_per_sample``: one number
for all, or a dict pinning some) are not measured; a source's ``measure``
function, when it has one, replaces the sampled measurement (called once per
unpinned dataset). The same seed, data and operators always give the same numbers. The numbers go
into the data config (and so into checkpoints); a resume takes them from the
checkpoint and never measures again.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..core.window import apply_record_ops, read_records
from ..curriculum import MixtureWorkSource
from ..curriculum.seeding import text_id
from ..errors import ConfigError
from ..operators.base import RecordOp

SAMPLE_SIZE = 512  # records read per dataset (or all, when it has fewer)
TAG = text_id("tokens-per-sample")  # the purpose in the generator's seed


def sample_indices(size: int, seed: int, dataset: int) -> np.ndarray:
    """The sorted flat indices (over the dataset's shards) of the measured records."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, TAG, dataset]))
    n = min(size, SAMPLE_SIZE)
    return np.sort(rng.choice(size, size=n, replace=False)).astype(np.int64)


def measure_tokens_per_sample(source: MixtureWorkSource, record_ops: tuple[RecordOp, ...],
                              names: tuple[str, ...] | None = None) -> dict[str, Fraction]:
    """``{dataset: exact mean tokens per sample}`` on each dataset's fixed sample (of ``names``
    only, when given)."""
    out: dict[str, Fraction] = {}
    for c, dataset in enumerate(source.datasets):
        if names is not None and dataset.name not in names:
            continue
        flat = sample_indices(source.sizes[c], source.seed, c)
        starts = np.cumsum([0, *dataset.shard_sizes])
        shard = np.searchsorted(starts, flat, side="right") - 1
        offset = flat - starts[shard]
        ds = np.full(len(flat), c, dtype=np.int64)
        where = f"measuring the tokens per sample of dataset {dataset.name!r} (weight_by='tokens')"
        try:
            records = read_records(source.datasets, ds, shard, offset, where)
            output = apply_record_ops(record_ops, source.names, -1, np.stack([ds, shard, offset], axis=1), records)
        except Exception as exc:
            exc.add_note(f"zephon_dask: {where}")
            raise
        out[dataset.name] = Fraction(len(output.table.tokens), len(flat))
    return out


def measured(source: MixtureWorkSource, record_ops: tuple[RecordOp, ...]) -> MixtureWorkSource:
    """``source`` with the tokens per sample of its unpinned datasets measured, if it still needs
    them (else itself): by the source's ``measure`` function when it has one, else on the fixed
    sample. The pinned values are kept."""
    if not source.unmeasured:
        return source
    if source.measure is None:
        return source.with_tokens_per_sample(measure_tokens_per_sample(source, record_ops, source.unpinned))
    return source.with_tokens_per_sample({n: _called(source, n) for n in source.unpinned})


def _called(source: MixtureWorkSource, name: str) -> object:
    dataset, measure = source.datasets[source.names.index(name)], source.measure
    assert measure is not None
    fn = getattr(measure, "__qualname__", repr(measure))
    try:
        value = measure(dataset)
    except Exception as exc:
        exc.add_note(f"zephon_dask: measure={fn} on dataset {name!r} (weight_by='tokens')")
        raise
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise ConfigError(f"measure={fn} returned {value!r} for dataset {name!r}; it must return the mean "
                          "tokens per sample, a positive number")
    return value
