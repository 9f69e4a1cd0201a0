"""The node-local cache of objects read from an object store: opt-in, bounded, shared by a node.

Switched on per dataset by ``storage_options["node_cache"] = {"dir": ..., "max_bytes": ...}``
(taken out before the options reach the filesystem). A shard's object is then
fetched whole once per node into ``<dir>/objects/<hh>/<sha256 of URL, size and
ETag>`` and read from there by every process of the node (the Dask workers of
every rank). Holds state only in that folder:

* **Atomic**: an object is downloaded to a temporary name beside its entry and
  renamed into place once its size matches the index; a reader never sees part
  of one.
* **One fetch per node**: the process that fetches holds an exclusive file lock
  (``<dir>/locks/<key>.lock``, ``fcntl.flock``); the others wait for it (polled,
  with a deadline) and then use the entry.
* **Checked**: an entry is named by the URL, size and ETag the index recorded and
  fetched with a ``GET`` conditional on that ETag (S3), so it holds the object
  as indexed: a changed object is refused, never stored under the old name. A
  read served from an entry sends no request.
* **LRU under ``max_bytes``**: a read touches its entry's mtime; after each
  fetch the least recently used entries are removed until the folder is under
  the limit (the entry just fetched is kept, even alone over the limit).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError, StorageError
from . import remote
from .paths import NODE_CACHE_KEY, filesystem
from .shard import Shard

KEY = NODE_CACHE_KEY
LOCK_WAIT = 600.0  # seconds a process waits for another one's fetch of the same object
_POLL = 0.05


def settings(storage_options: dict[str, Any] | None) -> tuple[str, int] | None:
    """``(dir, max_bytes)`` of the node cache these options switch on, or ``None``. Pure."""
    cfg = (storage_options or {}).get(KEY)
    if cfg is None:
        return None
    ok = isinstance(cfg, dict) and isinstance(cfg.get("dir"), str) and cfg["dir"]
    limit = cfg.get("max_bytes") if isinstance(cfg, dict) else None
    if not ok or not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise ConfigError(
            f"storage_options[{KEY!r}] must be {{'dir': <a local folder>, 'max_bytes': <a positive "
            f"int>}}, got {cfg!r}"
        )
    return os.path.abspath(os.path.expanduser(cfg["dir"])), int(limit)


def entry_name(shard: Shard) -> str:
    """The entry's name: the sha256 of the shard's URL, size and ETag. Pure."""
    return hashlib.sha256(f"{shard.path}\0{shard.size_bytes}\0{shard.etag}".encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: str, url: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"waited {LOCK_WAIT:.0f} s for another process of this node to fetch "
                        f"{url!r} into the node cache (lock {path!r}); check that process, or "
                        "remove the lock file if no process holds it"
                    ) from None
                time.sleep(_POLL)
        yield
    finally:
        os.close(fd)  # releases the lock


def local_copy(shard: Shard, storage_options: dict[str, Any] | None) -> str | None:
    """The path of ``shard``'s object in the node cache, fetched first if needed; ``None`` when
    the options switch no cache on or the shard has no size and ETag to check entries by."""
    conf = settings(storage_options)
    if conf is None or shard.path is None or shard.etag is None or shard.size_bytes is None:
        return None
    root, limit = conf
    name = entry_name(shard)
    target = os.path.join(root, "objects", name[:2], name)
    if _usable(target, shard.size_bytes):
        return target
    with _locked(os.path.join(root, "locks", f"{name}.lock"), shard.path):
        if _usable(target, shard.size_bytes):  # fetched by another process meanwhile
            return target
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.tmp-{uuid.uuid4().hex}"
        try:
            fs, name = filesystem(shard.path, storage_options)
            if remote.is_s3(fs):
                remote.download(fs, name, tmp, shard.size_bytes)  # conditional on the read's pin
            else:
                fs.get_file(name, tmp)
            got = os.path.getsize(tmp)
            if got != shard.size_bytes:
                raise StorageError(
                    f"fetching {shard.path!r} into the node cache gave {got:,} bytes, not the "
                    f"{shard.size_bytes:,} indexed; it changed during the fetch: rebuild the Dataset"
                )
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    _evict(root, limit, keep=target)
    return target


def _usable(target: str, size: int) -> bool:
    try:
        if os.path.getsize(target) != size:
            return False
        os.utime(target)  # most recently used
        return True
    except FileNotFoundError:
        return False


def _evict(root: str, limit: int, keep: str) -> None:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes."""
    with _locked(os.path.join(root, "locks", "evict.lock"), root):
        entries = []
        for dirpath, _, names in os.walk(os.path.join(root, "objects")):
            for n in names:
                if ".tmp-" in n:
                    continue
                path = os.path.join(dirpath, n)
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(path)
                    entries.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                total -= size
