"""Ranged reads of an S3 object, each one ``GET`` conditional on the ETag the listing recorded.

A read of a shard in an S3 bucket sends no request besides the ranges it needs:
no ``HEAD`` first. Inside :func:`pinned` (``Dataset.read`` opens it around a read),
:func:`fetch_ranges` asks each range with ``If-Match: <ETag from the listing>``, so
the store itself refuses an object whose ETag moved (``412``: :class:`TagMoved`, a
:class:`~zephon_dask.errors.DataChangedError` that ``Dataset.read`` settles by content: the
same bytes uploaded again read on, pinned to the new ETag from then on, see
:func:`retagged`), and marks the pin ``confirmed``; a
read that confirmed nothing (the bytes came from a per-process cache, or the
format read through another path) is checked with one ``HEAD`` afterwards.
:func:`download` fetches a whole object the same way (the node cache).

Requests go through one reading client per process and set of storage options,
shared by its threads and reused across reads (its connections stay open). That client does no
retries of its own; a range is retried here, alone, after a short bounded wait:
throttling (``503 SlowDown``), other 5xx, a connection reset or closed mid-body, a
body cut short and timeouts, up to :data:`ATTEMPTS` tries (or the
``config_kwargs["retries"]["max_attempts"]`` a user set in the storage options), the
waits doubling from :data:`FIRST_WAIT` to at most :data:`LAST_WAIT` seconds with
equal jitter. Other ranges of the read carry on meanwhile; nothing is listed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import DataChangedError

ATTEMPTS = 12  # tries of one range, unless the user's storage options set max_attempts
FIRST_WAIT = 0.02  # seconds before the second try of a range
LAST_WAIT = 8.0  # the longest wait between two tries; twelve tries wait 13-26 s in all
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                          "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                          "RequestLimitExceeded", "TooManyRequests"})
_JITTER = random.Random()  # wait lengths only: never data  # noqa: S311


@dataclass
class Pin:
    """The object a read expects: filesystem-internal ``name`` and its listed ``etag``;
    ``confirmed`` once a conditional request proved the store still holds it."""

    name: str
    etag: str
    confirmed: bool = False


class TagMoved(DataChangedError):
    """A read conditional on an ETag refused by the store: the object was written again since
    it was listed (maybe with the same bytes: the caller checks the content)."""


_RETAGGED: dict[tuple[str, str], str] = {}  # (name, listed ETag) -> the ETag of the same bytes now


def retagged(name: str, etag: str) -> str:
    """The ETag to pin reads of ``name`` listed with ``etag`` to: the listed one, or the one the
    same bytes carry since an upload again (:func:`same_bytes_under`)."""
    return _RETAGGED.get((name, etag), etag)


def same_bytes_under(name: str, etag: str, now: str) -> None:
    """Record that ``name``, listed with ``etag``, holds the same bytes under ETag ``now``."""
    _RETAGGED[(name, etag)] = now


_PIN: contextvars.ContextVar[Pin | None] = contextvars.ContextVar("zephon_dask_pin", default=None)


@contextlib.contextmanager
def pinned(name: str, etag: str) -> Iterator[Pin]:
    """Reads of ``name`` under this block are conditional on ``etag`` (see the module)."""
    pin = Pin(name, etag)
    token = _PIN.set(pin)
    try:
        yield pin
    finally:
        _PIN.reset(token)


def is_s3(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is an ``s3fs`` filesystem (the conditional reads speak its client)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols and hasattr(fs, "get_s3")


def active(fs: AbstractFileSystem, name: str) -> Pin | None:
    """The pin under which reads of ``name`` on ``fs`` are made conditional, if any."""
    pin = _PIN.get()
    if pin is None or pin.name != name.removeprefix("s3://") or not is_s3(fs):
        return None
    return pin


_READERS: dict[tuple[int, str], tuple[AbstractFileSystem, int]] = {}
_READERS_LOCK = threading.Lock()


def reader(fs: AbstractFileSystem) -> tuple[AbstractFileSystem, int]:
    """``(filesystem, attempts)``: the process's reading twin of ``fs`` (one per set of storage
    options, shared by every thread, so its connections are reused by every read), whose client
    does not retry (we do); and the tries a range gets."""
    key = (os.getpid(), json.dumps(fs.storage_options, sort_keys=True, default=repr))
    got = _READERS.get(key)
    if got is not None:
        return got
    with _READERS_LOCK:
        got = _READERS.get(key)
        if got is None:
            opts = dict(fs.storage_options)
            config = dict(opts.get("config_kwargs") or {})
            retries = config.get("retries") or {}
            from .paths import S3_DEFAULTS  # the listing's defaults are no setting of the user's

            if retries == S3_DEFAULTS["config_kwargs"]["retries"]:
                retries = {}
            attempts = int(retries.get("max_attempts") or retries.get("total_max_attempts") or ATTEMPTS)
            config["retries"] = {"max_attempts": 1, "mode": "standard"}  # one try: no botocore backoff
            config.setdefault("max_pool_connections", 32)
            opts["config_kwargs"] = config
            opts["skip_instance_cache"] = True  # not tied to the thread that made it
            got = _READERS[key] = (type(fs)(**opts), max(1, attempts))
    return got


def _split(name: str) -> tuple[str, str]:
    bucket, _, key = name.removeprefix("s3://").partition("/")
    return bucket, key


def _status(exc: BaseException) -> tuple[int | None, str]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, ""
    meta = response.get("ResponseMetadata") or {}
    return meta.get("HTTPStatusCode"), str((response.get("Error") or {}).get("Code", ""))


def _retryable(exc: BaseException) -> bool:
    status, code = _status(exc)
    if status is not None or code:
        return code in _RETRY_CODES or (status is not None and status >= 500)
    module = type(exc).__module__.split(".")[0]
    return isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError, ShortBody)) or module in (
        "aiohttp", "botocore", "aiobotocore", "urllib3")


class ShortBody(OSError):
    """A body shorter than the range asked (a connection closed mid-body)."""


def _wait(attempt: int) -> float:
    full = min(LAST_WAIT, FIRST_WAIT * 2**attempt)
    return full / 2 + _JITTER.random() * full / 2


async def retried(attempts: int, url: str, pin: Pin | None, call: Any) -> Any:
    """``await call()``, retried as the module says (at least one try); a ``412`` is the
    object changed."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            status, code = _status(exc)
            if pin is not None and (status == 412 or code == "PreconditionFailed"):
                raise TagMoved(
                    f"file {url!r} changed since it was indexed (its ETag is no longer "
                    f"{pin.etag!r}: the store refused a read conditional on it); reading on would "
                    "give other records than the Dataset describes: rebuild the Dataset to read "
                    "the new content (changed files are indexed again), or restore the file"
                ) from None
            if status is not None or code:
                from s3fs.errors import translate_boto_error  # type: ignore[import-untyped]

                if not _retryable(exc) or attempt + 1 >= attempts:
                    raise translate_boto_error(exc) from None
            elif not _retryable(exc) or attempt + 1 >= attempts:
                raise
        await asyncio.sleep(_wait(attempt))
        attempt += 1


async def _get(client: Any, kw: dict[str, Any], size: int | None) -> bytes:
    resp = await client.get_object(**kw)
    try:
        body: bytes = await resp["Body"].read()
    finally:
        resp["Body"].close()
    if size is not None and len(body) != size:
        raise ShortBody(f"{len(body)} of {size} bytes")
    return body


def _kwargs(fs: AbstractFileSystem, client: Any, name: str, pin: Pin | None, **extra: Any) -> dict[str, Any]:
    bucket, key = _split(name)
    kw: dict[str, Any] = {**(getattr(fs, "s3_additional_kwargs", None) or {}), "Bucket": bucket, "Key": key,
                          **extra, **(getattr(fs, "req_kw", None) or {})}
    if pin is not None:
        kw["IfMatch"] = f'"{pin.etag}"'
    accepted = client.meta.service_model.operation_model("GetObject").input_shape.members
    return {k: v for k, v in kw.items() if k in accepted}  # e.g. upload-only encryption settings


async def _ranges(fs: AbstractFileSystem, attempts: int, name: str, pin: Pin | None,
                  starts: list[int], ends: list[int]) -> list[bytes]:
    await fs.set_session()
    client = await fs.get_s3(_split(name)[0])
    url = f"s3://{name.removeprefix('s3://')}"

    async def one(lo: int, hi: int) -> bytes:
        if hi <= lo:
            return b""
        kw = _kwargs(fs, client, name, pin, Range=f"bytes={lo}-{hi - 1}")
        return await retried(attempts, url, pin, lambda: _get(client, kw, hi - lo))

    return list(await asyncio.gather(*(one(lo, hi) for lo, hi in zip(starts, ends, strict=True))))


def fetch_ranges(fs: AbstractFileSystem, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
    """The bytes ``[start, end)`` of the S3 object ``name``, one ``GET`` per range, concurrently,
    conditional on the pin's ETag when one is active (``pin.confirmed`` set after)."""
    from fsspec.asyn import sync

    pin = active(fs, name)
    twin, attempts = reader(fs)
    blobs: list[bytes] = sync(twin.loop, _ranges, twin, attempts, name, pin, starts, ends)
    if pin is not None and any(hi > lo for lo, hi in zip(starts, ends, strict=True)):
        pin.confirmed = True
    return blobs


async def _download(fs: AbstractFileSystem, attempts: int, name: str, pin: Pin | None, target: str,
                    size: int) -> None:
    await fs.set_session()
    client = await fs.get_s3(_split(name)[0])
    url = f"s3://{name.removeprefix('s3://')}"
    with open(target, "wb") as out:

        async def rest() -> None:
            at = out.tell()
            if at >= size:
                return
            resp = await client.get_object(**_kwargs(fs, client, name, pin, Range=f"bytes={at}-{size - 1}"))
            try:
                async for block in resp["Body"].iter_chunks(1 << 20):
                    out.write(block)
            finally:
                resp["Body"].close()
            if out.tell() != size:
                raise ShortBody(f"{out.tell()} of {size} bytes")

        await retried(attempts, url, pin, rest)  # a retry resumes where the body was cut


def download(fs: AbstractFileSystem, name: str, target: str, size: int) -> None:
    """Write the ``size`` bytes of the S3 object ``name`` to the local file ``target``
    (conditional on the pin's ETag when one is active, ``pin.confirmed`` set after)."""
    from fsspec.asyn import sync

    pin = active(fs, name)
    twin, attempts = reader(fs)
    sync(twin.loop, _download, twin, attempts, name, pin, target, size)
    if pin is not None:
        pin.confirmed = True

