"""A lost scheduler of an existing cluster: waited for, reconnected to, and the windows in flight
submitted again; :class:`Reconnecting`, a part of :class:`~.runner.DistributedRunner`. Holds state;
module state: the lost clients being closed (:func:`close_lost`).

A scheduler lost is waited for (:meth:`Reconnecting.outage`): ``distributed``'s client
cancels every future and reconnects to its address by itself, for its ``timeout``, but with a
growing random backoff (tries seconds apart after a few seconds down); a client the runner opened
(``address=``) is instead replaced by a new one as soon as the address accepts a connection again
(probed every :data:`~.watch.POLL` seconds at most). The runner then submits the spec and every
window in flight again under the same keys (a reconnecting client holds them until it is
connected), and meanwhile, with ``head_start``, the window the consumer waits for is computed in this process
(:func:`~.head_start.compute_here`): training slows down instead of stopping, with the same
bytes. No scheduler back within ``cluster_timeout``: :class:`~zephon_dask.errors.ClusterStallError`;
the embedded cluster's scheduler never comes back: :class:`~zephon_dask.errors.ClusterError` at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ClusterError, ClusterStallError
from ..graph import GroupGraph, WindowGraph
from .cluster import close_client, logger, open_client
from .head_start import compute_here
from .watch import POLL, PROBE_TIMEOUT, probe_address

_closing: list[object] = []  # lost clients being closed here (their reconnection's messages dropped)


def _not_a_cancelled_reconnect(record: logging.LogRecord) -> bool:
    exc = record.exc_info[0] if record.exc_info else None
    if exc is not None and issubclass(exc, asyncio.CancelledError):
        return False
    return not (_closing and record.getMessage().startswith("Failed to reconnect to scheduler"))


def quiet_reconnect_cancel() -> None:
    """Drop what ``distributed`` logs when a client that reconnects to a lost scheduler is closed
    (its reconnection cancelled: a traceback, and "Failed to reconnect ... closing client" while
    :func:`close_lost` closes one): the runner closes such a client on purpose."""
    log = logging.getLogger("distributed.client")
    if _not_a_cancelled_reconnect not in log.filters:
        log.addFilter(_not_a_cancelled_reconnect)


def close_lost(client) -> None:
    """Close ``client`` (:func:`~.cluster.close_client`); one reconnecting to a lost scheduler
    without the messages of the reconnection cancelled."""
    if client.status != "connecting":
        close_client(client)
        return
    quiet_reconnect_cancel()
    token = object()
    _closing.append(token)
    try:
        close_client(client)
    finally:
        _closing.remove(token)


class Reconnecting:
    """The :class:`~.runner.DistributedRunner`'s handling of a lost scheduler (its methods read the
    runner's client, watch, spec future, settings and windows in flight)."""

    # the runner's, read here
    _client: Any
    _spec_future: Any
    _own_client: bool
    _own_cluster: bool
    _adopt: threading.Lock
    _abandoned: bool
    _early_slots: Any
    _in_flight: Any
    _in_flight_lock: threading.Lock
    _connect: Callable[..., None]
    _submit_spec: Callable[..., None]
    watch: Any
    settings: Any
    spec: Any
    computed_here: list[tuple[int, int]]

    def init_reconnect(self) -> None:
        self._recover_lock = threading.Lock()  # the spec is submitted again once per lost scheduler
        self._lost_at: float | None = None  # time.monotonic() when the scheduler was found lost, until it is back
        self._lost_here = 0  # windows computed here since then
        self._probed = -math.inf  # time.monotonic() when the lost scheduler's address was last probed

    @property
    def lost_for(self) -> float | None:
        """Seconds since the scheduler was found lost, while it is (see :meth:`outage`); else ``None``."""
        lost = self._lost_at
        return None if lost is None else time.monotonic() - lost

    def outage(self) -> bool:
        """Whether the scheduler is lost now: from when the client finds it gone until a scheduler
        at its address answers and a worker of it has computed the spec again (see the module
        docstring: a cold worker takes seconds to start), asked every
        :data:`~.watch.POLL` seconds at most. A scheduler lost since the windows in flight were
        submitted (the client cancelled their futures) has them submitted again first
        (:meth:`recover`); the loss and the return are logged once each. Raises
        :class:`ClusterStallError` once that has lasted ``cluster_timeout`` seconds,
        :class:`ClusterError` if the client closed (it gave up) or the lost scheduler was the
        embedded cluster's (none comes back at its address)."""
        client = self._client
        if client is None:
            return False
        self.watch.check_open()
        self.recover()
        now, timeout = time.monotonic(), self.settings.cluster_timeout
        if self._lost_at is None:
            if client.status == "running":
                return False
            self._lose(now)
        assert self._lost_at is not None
        if now - self._probed < POLL:
            return True
        self._probed = now
        if self._back():
            self._log_back(now)
            return False
        if now - self._lost_at >= timeout:
            raise ClusterStallError(f"no Dask scheduler with a worker answered at {self.watch.address} for "
                                    f"{timeout:g} s after it was lost; restart the cluster and resume from the "
                                    "last checkpoint, or raise the cluster_timeout option")
        return True

    def note_back(self) -> None:
        """While a lost scheduler is waited for, end the wait if a scheduler computes again (a window
        came from it, fetched ahead), without asking it anything."""
        spec, client = self._spec_future, self._client
        if (self._lost_at is not None and client is not None and client.status == "running"
                and spec is not None and spec.status == "finished"):
            self._log_back(time.monotonic())

    def _log_back(self, now: float) -> None:
        assert self._lost_at is not None
        logger.warning("zephon_dask: reconnected to the Dask scheduler at %s after %.1f s (%d window(s) "
                       "computed in this process meanwhile)", self.watch.address, now - self._lost_at,
                       self._lost_here)
        self._lost_at = None

    def _back(self) -> bool:
        """Whether a scheduler answers again and a worker of it has computed the spec submitted
        again (a client this runner opened is replaced first, :meth:`_reopen`)."""
        if self._client is None or self._client.status != "running":
            if not self._own_client or not self._reopen():
                return False
        spec = self._spec_future
        return spec is not None and spec.status == "finished"  # a worker is up and computes

    def recover(self) -> None:
        """If the client lost its scheduler (it cancels every future when it reconnects, the spec's
        too): submit the spec again, then every window in flight cancelled with it (see
        :meth:`renew_in_flight`)."""
        spec_future = self._spec_future
        if spec_future is None or not spec_future.cancelled():
            return
        with self._recover_lock:
            if self._spec_future is not spec_future or self._client is None:
                return  # submitted again on another thread meanwhile, or closed
            self._submit_spec(self._client)
        if self._lost_at is None:  # the client may be back already: the loss lasts until a worker computes
            self._lose(time.monotonic())
        self.renew_in_flight()

    def _lose(self, now: float) -> None:
        """The scheduler is lost from ``now`` on: logged; the embedded cluster's, a :class:`ClusterError`."""
        quiet_reconnect_cancel()
        if self._own_cluster:
            raise ClusterError("the embedded Dask cluster lost its scheduler (its process was killed or "
                               "exited); build the pipeline again and resume from the last checkpoint")
        self._lost_at, self._lost_here, self._probed = now, 0, -math.inf
        here = "; meanwhile the windows needed are computed in this process" if self.settings.head_start else ""
        logger.warning("zephon_dask: lost the Dask scheduler at %s; waiting up to %g s (cluster_timeout) for one "
                       "there whose worker computes, then the windows in flight are computed on the cluster "
                       "again%s", self.watch.address, self.settings.cluster_timeout, here)

    def renew_in_flight(self, every: bool = False) -> None:
        """Submit again, highest priority first and under the same keys, every window in flight
        whose futures were lost (``every``: each not yet fetched, its futures another client's)."""
        with self._in_flight_lock:
            handles = list(self._in_flight)
        for handle in sorted(handles, key=lambda h: -h.priority):
            if handle.lost or (every and not handle.fetched):
                handle.renew()

    def _reopen(self) -> bool:
        """Replace the client this runner opened, which lost its scheduler, by a new one if the
        address accepts a connection now; the windows in flight go to it, the old client is
        closed in the background. Whether it was replaced."""
        address, timeout = self.watch.address, self.settings.cluster_timeout
        try:
            probe_address(address, PROBE_TIMEOUT)
            client = open_client(address, min(timeout, PROBE_TIMEOUT))
        except ClusterError:
            return False
        with self._adopt:
            old, abandoned = self._client, self._abandoned
            if not abandoned:
                self._early_slots = None  # made on the old client's event loop
                self._connect(client, address, timeout)
        if abandoned:  # closed meanwhile
            close_client(client)
            return False
        self.renew_in_flight(every=True)
        threading.Thread(target=close_lost, args=(old,), name="zephon-close-lost-client", daemon=True).start()
        return True

    def compute_here(self, graph: WindowGraph | GroupGraph) -> Any:
        """``graph``'s value computed in this process while no scheduler answers
        (:func:`~.head_start.compute_here`), ``None`` with ``head_start=False`` (then every window
        waits for the cluster)."""
        if not self.settings.head_start:
            return None
        value = compute_here(self.spec, graph, os.cpu_count() or 1)
        members = graph.members if isinstance(graph, GroupGraph) else ((graph.lane, graph.window),)
        self.computed_here.extend(members)
        self._lost_here += len(members)
        return value

