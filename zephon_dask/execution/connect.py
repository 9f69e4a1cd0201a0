"""Dask for jobs other than the pipeline (``prepare_tokens``): a client (:func:`connect`) and
tasks yielded as they finish (:func:`each_completed`). Holds no state.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .cluster import local_cluster, open_client, use_distributed
from .watch import DEFAULT_TIMEOUT, ClusterWatch

if TYPE_CHECKING:
    from distributed import Client


@contextmanager
def connect(client=None, address: str | None = None, n_workers: int | None = None,
            processes: bool = True, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Client]:
    """Yield ``client``, a client of the scheduler at ``address`` (see :func:`~.cluster.open_client`), or one
    on an embedded cluster (:func:`~.cluster.local_cluster`: ``n_workers`` or all cores, one thread each;
    worker processes with :data:`~.cluster.WORKER_ENV`, or threads of this process with ``processes=False``). Closes only
    what it started."""
    use_distributed()
    from distributed import Client

    if client is not None:
        yield client
        return
    if address is not None:
        with open_client(address, timeout) as own:
            yield own
        return
    with local_cluster(n_workers, 1, processes, timeout=timeout) as cluster, \
            Client(cluster, set_as_default=False, direct_to_workers=processes) as own:
        yield own


def _shared_value(value):
    return value


def _apply(fn: Callable, shared: tuple, *args):
    return fn(*shared, *args)


def each_completed(client: Client, fn: Callable, shared: tuple, calls: Sequence[tuple],
                   keys: Sequence[str], shared_key: str,
                   timeout: float = DEFAULT_TIMEOUT) -> Generator[tuple[int, Any, BaseException | None], None, None]:
    """Run ``fn(*shared, *call)`` as one task per call under ``keys``; yield ``(index, result,
    error)`` as the tasks finish.

    ``shared`` travels once, as a task (recomputed if the worker holding it dies). A task
    lost with its worker before its result reached this process is rerun by the
    scheduler; once read, a result is released, so no later worker loss reruns it. On
    exit (close the generator, e.g. with ``contextlib.closing``) every future is
    cancelled. ``keys`` and ``shared_key`` must be unique to the call: a cancel is
    asynchronous, and a key submitted again meanwhile is cancelled with the old one.
    Waits go through a :class:`~.watch.ClusterWatch` (``timeout`` seconds without scheduler or
    worker raise :class:`~zephon_dask.errors.ClusterStallError`).
    """
    watch = ClusterWatch(client, timeout)
    common = client.submit(_shared_value, shared, key=shared_key, pure=False, priority=1_000_000)
    futures = [client.submit(_apply, fn, common, *call, key=key, pure=False)
               for call, key in zip(calls, keys, strict=True)]
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        pending = list(futures)
        while pending:
            fut = watch.wait(pending)
            if fut is None:
                continue
            pending.remove(fut)
            try:
                result, error = fut.result(), None
            except Exception as exc:  # the task's own error, re-raised here by distributed
                result, error = None, exc
            client.cancel([fut])  # forget it now: a worker lost later must not rerun a finished task
            yield index[fut.key], result, error
    finally:
        client.cancel([*futures, common])
