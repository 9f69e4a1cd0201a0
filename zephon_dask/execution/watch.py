"""Bounded waits on a Dask cluster: a deadline and a liveness check for every wait. Holds state.

A :class:`ClusterWatch` belongs to one client. :meth:`ClusterWatch.wait` waits for
the first of some futures to finish, and :meth:`ClusterWatch.fetch` for a
finished one's result, in slices of at most :data:`POLL` seconds; after a slice
that ends without one it checks that the client is open and connected and, at
most every :data:`CHECK_EVERY` seconds (every :data:`POLL` seconds while a fault
is pending), that it reaches its scheduler and that the scheduler has a worker. A condition that stays false for ``timeout`` seconds after it is first
seen raises :class:`~zephon_dask.errors.ClusterStallError`; a client that is
closed (by the user, or by ``distributed`` after it failed to reconnect) raises
:class:`~zephon_dask.errors.ClusterError` at once. A fast wait costs nothing
extra: the liveness RPC is only made once a slice has passed. A wait never
spins: a future whose result was lost with its worker (status ``lost``) is not
done, and a slice waiting for it lasts until it finishes again or the slice ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import socket
import time
from collections.abc import Sequence

from ..errors import ClusterError, ClusterStallError
from ..options import BY_NAME as OPTIONS
from . import dask_compat

DEFAULT_TIMEOUT: float = OPTIONS["cluster_timeout"].default  # seconds without scheduler or worker
DEFAULT_STALL: float = OPTIONS["stall_timeout"].default  # seconds one window may compute unreported
CONNECT_TIMEOUT = 5.0  # seconds to open a connection to a scheduler address
POLL = 1.0  # the longest slice of a wait
CHECK_EVERY = 5.0  # seconds between two liveness RPCs while waits keep ending empty (at most timeout / 2)
PROBE_TIMEOUT = 5.0  # seconds one liveness RPC may take
NOT_FETCHED = object()  # what ClusterWatch.fetch returns for a result it could not fetch in time


def probe_address(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise :class:`ClusterError` unless a TCP connection to ``address`` opens within ``timeout``.

    Only ``tcp://`` and ``tls://`` addresses are probed (others pass): a closed port
    fails in milliseconds here instead of ``distributed``'s 30 s of retries.
    """
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp", "tls"):
        return
    host, _, port = rest.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise ClusterError(f"scheduler address {address!r} has no port; use e.g. tcp://127.0.0.1:8786") from None
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", port_n), timeout=timeout):
            pass
    except OSError as exc:
        raise ClusterError(
            f"no Dask scheduler answers at {address!r} ({exc.strerror or exc}; waited at most "
            f"{timeout:g} s): start one (`dask scheduler`) or fix the address"
        ) from None


class ClusterWatch:
    """Liveness of one client's cluster, with the time each fault was first seen."""

    def __init__(self, client, timeout: float = DEFAULT_TIMEOUT, address: str | None = None):
        self.client, self.timeout = client, float(timeout)
        self.address = address or _address(client)
        self._since: dict[str, float] = {}  # fault -> monotonic time first seen
        self._checked = -math.inf  # monotonic time of the last liveness RPC
        self._every = min(CHECK_EVERY, self.timeout / 2)
        self.waits = 0  # slices waited (a future not done yet)
        self.checks = 0  # liveness RPCs sent

    def _fault(self, name: str, message: str) -> None:
        """Note that ``name`` holds now; raise once it has held ``timeout`` seconds."""
        first = self._since.setdefault(name, time.monotonic())
        if time.monotonic() - first >= self.timeout:
            raise ClusterStallError(
                f"{message} for {self.timeout:g} s (scheduler {self.address}); check the cluster, "
                "restart it and resume from the last checkpoint, or raise the "
                f"cluster_timeout option (now {self.timeout:g} s)"
            )

    @property
    def unreachable(self) -> bool:
        """Whether the last :meth:`check` found the scheduler unreachable or not answering."""
        return "scheduler" in self._since

    def check_open(self) -> str:
        """The client's status; a :class:`ClusterError` if it is closed (no RPC)."""
        status = getattr(self.client, "status", "closed")
        if status in ("closing", "closed"):
            raise ClusterError(
                f"the Dask client of scheduler {self.address} is closed (closed by its owner, or "
                "by distributed after it lost the scheduler); restart the cluster and resume "
                "from the last checkpoint"
            )
        return status

    def check(self) -> None:
        """Raise if the cluster has been unusable for ``timeout`` seconds, or the client is closed."""
        if self.check_open() != "running":
            self._fault("scheduler", "the scheduler has been unreachable")
            return
        self._since.pop("scheduler", None)
        self._checked = time.monotonic()
        self.checks += 1
        try:
            info = dask_compat.identity(self.client, 0, PROBE_TIMEOUT)
        except Exception:  # an RPC that fails or times out: the scheduler is not answering
            self._fault("scheduler", "the scheduler has not answered")
            return
        self._since.pop("scheduler", None)
        if not info.get("n_workers"):
            self._fault("workers", "the scheduler has had no worker")
        else:
            self._since.pop("workers", None)

    def wait(self, futures: Sequence, timeout: float = POLL):
        """The first finished (or failed, or cancelled) future of ``futures`` (``None`` entries are
        skipped), or ``None`` after ``timeout`` seconds. After a slice that ends without one,
        checks liveness (not before: a consumer ahead of the workers waits for every window, and
        a liveness RPC per wait would cost the scheduler a message per window per rank): at most
        every :data:`CHECK_EVERY` seconds while no fault is pending (each RPC costs this process's
        event loop CPU while it waits on slower workers), at most every :data:`POLL` seconds while
        one is. Fetches no result. :attr:`waits` counts the slices, :attr:`checks` the RPCs."""
        from distributed import CancelledError  # a client exists: distributed is imported

        live = [f for f in futures if f is not None]
        self.check_open()
        done = next((f for f in live if f.done()), None)
        if done is not None:
            return done
        self.waits += 1
        try:  # on the client's event loop; returns once a future is done, not when one is lost
            dask_compat.wait_first(self.client, live, timeout, timeout + PROBE_TIMEOUT)
        except (TimeoutError, CancelledError):  # the slice ended; a cancelled future is done
            pass
        except Exception:
            self.check_open()  # closed meanwhile: say so; else the client's own error
            raise
        done = next((f for f in live if f.done()), None)
        if done is None:
            self._check_if_due()
        return done

    def fetch(self, future, limit: float, fetching: concurrent.futures.Future | None = None):
        """The value of the finished ``future``, fetched on the client's event loop while this
        thread waits in slices of at most :data:`POLL` seconds, checking liveness between them as
        :meth:`wait` does (a result lost with its worker is computed again meanwhile, and a
        cluster left without workers raises :class:`~zephon_dask.errors.ClusterStallError`).
        :data:`NOT_FETCHED` after ``limit`` seconds (a frozen worker holding it); the fetch is then
        cancelled (after a cluster error it is left to end with the client: cancelled while it
        waits for a lost result, Dask's gather leaves orphaned tasks that log at exit). A slice
        counts in :attr:`waits`. A client that lost its scheduler (reconnecting) ends the wait with
        ``CancelledError``, the fetch left to end with it (the result is computed again).
        ``fetching``: a fetch of ``future`` already under way (its value a one-item list, as a
        gather's), waited for instead of starting one."""
        from distributed import CancelledError  # a client exists: distributed is imported

        self.check_open()
        client = self.client
        if fetching is None:
            fetching = asyncio.run_coroutine_threadsafe(client.gather([future], asynchronous=True),
                                                        client.loop.asyncio_loop)
        end = time.monotonic() + limit
        while True:
            try:
                return fetching.result(timeout=max(0.0, min(POLL, end - time.monotonic())))[0]
            except TimeoutError:
                if fetching.done():  # the fetch's own error
                    raise
                if time.monotonic() >= end:
                    fetching.cancel()
                    return NOT_FETCHED
                if client.status == "connecting":  # its result went with the scheduler: computed again
                    raise CancelledError(future.key) from None  # the fetch ends with the client's reconnection
                self.waits += 1
                self._check_if_due()
            except CancelledError:
                self.check_open()  # the client closed meanwhile: say so
                raise

    def _check_if_due(self) -> None:
        """After a slice without a result: :meth:`check` if :data:`CHECK_EVERY` seconds passed
        since the last one (:data:`POLL` while a fault is pending), or the client is not running."""
        since = time.monotonic() - self._checked
        if self.check_open() != "running" or since >= (POLL if self._since else self._every):
            self.check()


def _address(client) -> str:
    try:
        return str(client.scheduler.address)
    except Exception:  # a client that never connected
        return "<unknown>"
