"""Which runner a pipeline uses, and starting it. Holds no state.

:data:`RUNNERS` names every runner; :func:`choose_runner` is the one place that
decides which of them a pipeline's options select, and :func:`make_runner`
starts it through the class's ``from_options``. A runner's module is imported
when its class is first looked up, so importing this module imports neither
``distributed`` nor the cluster code. Adding a runner means writing its
:class:`~zephon_dask.execution.base.Runner` subclass (its capabilities are class
attributes there) and one line here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping

from ..core.spec import PipelineSpec
from ..errors import ConfigError
from ..log import logger
from .base import Runner


class RunnerRegistry(MutableMapping[str, type[Runner]]):
    """``{name: Runner subclass}``, each given as a class or as ``"module:Class"`` (relative to
    this package), imported on first lookup."""

    def __init__(self, entries: dict[str, str | type[Runner]]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> type[Runner]:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, attr = entry.split(":")
            entry = self._entries[name] = getattr(importlib.import_module(module, __package__), attr)
        return entry

    def __setitem__(self, name: str, runner: str | type[Runner]) -> None:
        self._entries[name] = runner

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


RUNNERS = RunnerRegistry({
    "distributed": ".runner:DistributedRunner",
    "threads": ".local:ThreadRunner",
    "synchronous": ".local:SynchronousRunner",
})
RUNNER_NAMES: tuple[str, ...] = tuple(RUNNERS)


def choose_runner(options: dict) -> str:
    """The name of the runner ``options`` select: ``client=`` or ``address=`` force
    ``"distributed"``; otherwise ``options['runner']``. Starts nothing."""
    if options.get("client") is not None or options.get("address") is not None:
        return "distributed"
    return options["runner"]


def session_client():
    """The Dask client this process made current (``Client(...)`` does, unless told
    ``set_as_default=False``), or ``None``; ``None`` without importing ``distributed`` if nothing in
    this process has (no client can exist then)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        client = default_client()
    except ValueError:  # no default client
        return None
    return client if client.status == "running" else None


def make_runner(spec: PipelineSpec, options: dict) -> Runner:
    """The runner :func:`choose_runner` names, started.

    The ``distributed`` runner uses, in this order: ``client=``, ``address=``, the
    session's current Dask client (unless ``session_client=False``), or a new
    embedded ``LocalCluster``.
    """
    name = choose_runner(options)
    if (name == "distributed" and options.get("client") is None and options.get("address") is None
            and options.get("session_client", True)):
        client = session_client()
        if client is not None:
            logger.info("using the session's Dask client (scheduler %s); .options(session_client=False) "
                        "starts an embedded cluster instead", client.scheduler.address)
            options = {**options, "client": client}
    if name not in RUNNERS:
        raise ConfigError(f"runner={name!r} is unknown; choose one of {', '.join(map(repr, RUNNER_NAMES))}")
    return RUNNERS[name].from_options(spec, options)
