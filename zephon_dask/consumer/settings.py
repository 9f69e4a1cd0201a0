"""``ConsumerSettings``: how one stream submits and serves windows, as one frozen object. Pure.

Built once per stream from the pipeline's options and its runner's share of worker threads
(:meth:`ConsumerSettings.from_options`), and read where it is used: the round-robin by
:class:`~.stream.BatchStream`, the rest by :class:`~.fetcher.WindowFetcher`. None of it changes
what a window or a batch holds. A new execution option that the consumer reads is a field here
named as the option: :meth:`~ConsumerSettings.from_options` fills it, and no signature changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ConsumerSettings:
    """A stream's settings. ``deterministic``, ``fuse``, ``windows_per_task`` and
    ``prefetch_bytes`` are the options of those names; the rest is derived from the options and
    the runner (see :meth:`from_options`):

    * ``prefetch``: windows kept in flight (scaled by the automatic windows per task with
      ``scale_prefetch``);
    * ``split_first``: with ``fuse``, the first submissions, one per lane, split into chunk tasks;
    * ``split_last``: with ``fuse``, the iteration's last windows split so (when every lane ends);
    * ``alone_at_end``: the iteration's last windows never grouped with others;
    * ``threads``: the worker threads of this stream's share (the automatic size's bound).

    See :mod:`.fetcher` for what each does."""

    prefetch: int = 1
    deterministic: bool = True
    fuse: bool = False
    windows_per_task: int | None = 1
    prefetch_bytes: int | None = None
    scale_prefetch: bool = False
    split_first: int = 0
    split_last: int = 0
    alone_at_end: int = 0
    threads: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, Any], runner, lanes: int) -> ConsumerSettings:
        """The settings of a stream over ``lanes`` lanes on ``runner``: every field named as an
        option from ``options``; the prefetch is ``prefetch_windows`` or the runner's default (then
        scaled with the automatic windows per task); the worker threads of the stream's share
        (:meth:`~zephon_dask.execution.base.Runner.share`) give the windows split at the
        iteration's start and end (with more than one thread) and those computed alone at its end."""
        slots = runner.share(lanes)
        split = slots if slots > 1 else 0
        named = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
        return cls(**{**named, "prefetch": options["prefetch_windows"] or runner.default_prefetch(lanes),
                      "scale_prefetch": not options["prefetch_windows"], "threads": slots,
                      "split_first": split, "split_last": split, "alone_at_end": slots})
