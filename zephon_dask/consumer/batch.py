"""``Batch``: what the training loop receives. Built from one lane's samples; pure.

A batch never mixes lanes. Its arrays are ``[microbatch, length]``:
``tokens`` (padded with ``pad_id``), ``positions``, ``document_ids`` (``-1``
on padding) and ``lengths``; on request ``input_ids``/``labels``/``loss_mask``,
``cu_seqlens`` (for variable-length attention) and ``dataset_ids`` (each token's dataset index,
in the order of the pipeline's datasets, -1 on padding); and one array per field kept by
``tokenize(keep=[...])``, each token's document value (padding: -1 for ints, NaN for floats,
False for bools).

Two label conventions (``BatchOptions.labels``):

- ``True`` or ``"shifted"``: ``labels[:, t]`` is the target of position ``t``,
  the token at ``t + 1`` (for a loss computed directly on the logits);
- ``"hf"``: Hugging Face causal-LM style, unshifted: the model shifts, so
  ``labels[:, t]`` is the token at ``t``, and the batch also carries
  ``attention_mask`` and ``position_ids``; ``model(**batch)`` takes it.

Both put ``ignore_index`` on every target that must not be trained: padding
and, with ``mask_document_boundaries``, the first token of a document that
follows another one in the row, and (for samples carrying a ``loss_mask``,
e.g. from ``tokenize_chat``) every token whose mask is 0. They hold the same targets, one column
apart: ``hf[:, 1:] == shifted[:, :-1]``, ``hf[:, 0]`` and ``shifted[:, -1]``
are ``ignore_index``; ``loss_mask`` marks the trained targets in both.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .. import views
from ..errors import ConfigError
from ..validate import check_int, did_you_mean

LABEL_CONVENTIONS = (False, True, "shifted", "hf")
BATCH_KEYS = ("tokens", "positions", "document_ids", "lengths", "input_ids", "labels", "loss_mask",
              "attention_mask", "position_ids", "cu_seqlens", "dataset_ids")  # the names a kept field may not take


@dataclass(frozen=True)
class BatchOptions:
    """Batch shape and the fields to build (data settings, immutable)."""

    microbatch_size: int = 8
    drop_last: bool = True
    labels: bool | str = False
    ignore_index: int = -100
    mask_document_boundaries: bool = False
    cu_seqlens: bool = False
    pad_id: int = 0
    dataset_ids: bool = False

    def __post_init__(self):
        object.__setattr__(self, "microbatch_size",  # a numpy int becomes an int (JSON in states)
                           check_int(self.microbatch_size, "microbatch_size", 1, call="batch", hint="e.g. 8"))
        if self.labels not in LABEL_CONVENTIONS or isinstance(self.labels, int) and not isinstance(self.labels, bool):
            raise ConfigError(
                f"batch(labels={self.labels!r}) is unknown; {did_you_mean(self.labels, LABEL_CONVENTIONS)}"
                "use False, True (= 'shifted': next-token targets) "
                "or 'hf' (unshifted, for models that shift themselves, e.g. Hugging Face causal LMs)"
            )
        if not isinstance(self.ignore_index, int) or isinstance(self.ignore_index, bool):
            raise ConfigError(f"batch(ignore_index={self.ignore_index!r}) must be an int, e.g. -100 (the "
                              "label of positions not trained on)")

    def config(self) -> dict:
        """The options as a plain dict (for the pipeline's config); ``dataset_ids`` only when set,
        so configs without it read as before it existed."""
        return {k: v for k, v in self.__dict__.items() if k != "dataset_ids" or v}

    @property
    def label_convention(self) -> str | None:
        """``None`` (no labels), ``"shifted"`` or ``"hf"``."""
        if self.labels is False:
            return None
        return "shifted" if self.labels is True else self.labels


class Batch(Mapping):
    """A read-only mapping of field name -> numpy array, plus where it sits in its lane.

    ``lane`` and ``index_in_lane`` name the batch; ``position`` is the lane's
    frontier after it, ``(window, offset)`` of the next undelivered sample,
    and ``last`` says it is the lane's final batch (both feed checkpoints).
    ``counts``: its :meth:`dataset_counts` when already counted (read-only).
    """

    def __init__(self, arrays: dict[str, np.ndarray], lane: int, index_in_lane: int,
                 lineage: list[np.ndarray], dataset_names: tuple[str, ...],
                 position: tuple[int, int] = (0, 0), last: bool = False,
                 counts: np.ndarray | None = None):
        self._arrays = arrays
        self.lane = lane
        self.index_in_lane = index_in_lane
        self.lineage = lineage  # per row: (dataset, shard, offset, token_start, token_count)
        self.dataset_names = dataset_names
        self.position = position
        self.last = last
        self._counts = counts

    def __getitem__(self, key: str) -> np.ndarray:
        return self._arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    @property
    def num_samples(self) -> int:
        """Rows in this batch (the microbatch size, or fewer in a last batch kept by ``drop_last=False``)."""
        return int(self._arrays["tokens"].shape[0])

    def sources(self, row: int) -> list[tuple[str, int, int, int, int]]:
        """Where row ``row``'s tokens came from: ``(dataset, shard, offset, token_start, count)``."""
        return [(self.dataset_names[d], s, o, t, n) for d, s, o, t, n in self.lineage[row].tolist()]

    def dataset_counts(self) -> np.ndarray:
        """``[2, len(dataset_names)]``, read-only: :meth:`dataset_tokens` and
        :meth:`dataset_samples` in one array (what checkpoints and ``stats()`` count)."""
        if self._counts is None:
            counts = np.stack((self.dataset_tokens(), self.dataset_samples()))
            counts.flags.writeable = False
            self._counts = counts
        return self._counts

    def dataset_tokens(self) -> np.ndarray:
        """Real (non-padding) tokens per dataset, indexed like ``dataset_names``."""
        if self._counts is not None:
            return self._counts[0].copy()
        if not self.lineage:
            return np.zeros(len(self.dataset_names), dtype=np.int64)
        rows = np.concatenate(self.lineage)
        counts = np.bincount(rows[:, 0], weights=rows[:, 4], minlength=len(self.dataset_names))
        return counts.astype(np.int64)

    def dataset_samples(self) -> np.ndarray:
        """Source records per dataset whose first token is in this batch (a record cut across rows
        or batches counts once, where it starts), indexed like ``dataset_names``."""
        if self._counts is not None:
            return self._counts[1].copy()
        if not self.lineage:
            return np.zeros(len(self.dataset_names), dtype=np.int64)
        rows = np.concatenate(self.lineage)
        return np.bincount(rows[rows[:, 3] == 0, 0], minlength=len(self.dataset_names)).astype(np.int64)

    def to_torch(self, device=None, non_blocking: bool = False) -> dict:
        """Dict of torch tensors (int64 ids; see :mod:`zephon_dask.consumer.torch_io`)."""
        from .torch_io import batch_to_torch

        return batch_to_torch(self, device=device, non_blocking=non_blocking)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self._arrays.items())
        return f"Batch(lane={self.lane}, index_in_lane={self.index_in_lane}, {shapes})"

    def _repr_html_(self) -> str:
        return views.show("batch_html", self)
