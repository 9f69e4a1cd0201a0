"""A small byte-bounded LRU for per-process caches (holds state; thread-safe)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ByteLRU:
    """Least-recently-used mapping whose values total at most ``max_bytes``.

    The most recent entry is always kept, even when it alone exceeds the bound.
    State is process-local: it is never pickled with a dataset.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The cached value for ``key`` or ``None``."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Store ``value`` (weighing ``nbytes``), evicting the oldest entries over the bound."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._total -= old[1]
            self._items[key] = (value, nbytes)
            self._total += nbytes
            while self._total > self.max_bytes and len(self._items) > 1:
                _, (_, dropped) = self._items.popitem(last=False)
                self._total -= dropped

    @property
    def total(self) -> int:
        """The bytes the cached values weigh."""
        return self._total

    def values(self) -> list[Any]:
        """The cached values, oldest first."""
        with self._lock:
            return [value for value, _ in self._items.values()]

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._total = 0
