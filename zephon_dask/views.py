"""A registry of views: the HTML that an upper layer draws for lower layers' objects' ``_repr_html_``.

The package imports one way: lower layers (data, curriculum, consumer, state,
pipeline) never import higher ones, not even inside a function. Yet a
:class:`~zephon_dask.data.Dataset` in a notebook cell wants the HTML table that
:mod:`zephon_dask.inspect` draws. So the upper layer registers its functions
here under stable names, and the lower layer asks for them by name::

    # zephon_dask/inspect/reprs.py (upper layer)
    @views.register("dataset_html")
    def dataset_html(dataset) -> str: ...

    # zephon_dask/data/dataset.py (lower layer)
    def _repr_html_(self) -> str:
        return views.show("dataset_html", self)

This module imports only the standard library and :mod:`zephon_dask.errors`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import NotFoundError

F = TypeVar("F", bound=Callable[..., Any])

# The package that provides the views (zephon_dask.inspect.reprs registers them when it is
# imported). It is named here as a string, and imported on the first ``show`` of a name not
# registered yet, because a static import would point upward (this module lies at the bottom
# of the layers). The registry serves only the reprs of lower layers' objects (their
# ``_repr_html_``); everything else imports the inspect package downward.
PROVIDERS = ("zephon_dask.inspect",)

_views: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def register(name: str, fn: Callable[..., Any] | None = None):
    """Register ``fn`` as the view ``name``; returns ``fn``.

    Without ``fn``, a decorator: ``@register("dataset_html")``. Registering a
    name again replaces the earlier function (a reloaded module, a test's stub).
    """
    def add(f: F) -> F:
        with _lock:
            _views[name] = f
        return f

    return add if fn is None else add(fn)


def lookup(name: str) -> Callable[..., Any]:
    """The function registered as ``name``, importing the provider package first if needed.

    Raises :class:`~zephon_dask.errors.NotFoundError` (a ``KeyError``) when the
    name is still missing; the message lists the registered names.
    """
    fn = _views.get(name)
    for provider in PROVIDERS:
        if fn is not None:
            break
        importlib.import_module(provider)
        fn = _views.get(name)
    if fn is None:
        known = ", ".join(sorted(_views)) or "none"
        raise NotFoundError(
            f"no view is registered as {name!r} (registered: {known}); "
            f"a view is registered with zephon_dask.views.register({name!r}, fn)"
        )
    return fn


def show(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the view registered as ``name`` with ``args`` and ``kwargs``; return its result."""
    return lookup(name)(*args, **kwargs)


def names() -> list[str]:
    """The names registered so far, sorted (the provider package is not imported)."""
    return sorted(_views)
