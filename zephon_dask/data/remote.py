"""Ranged reads of an S3 object, each ``GET`` conditional on the ETag the listing recorded.

A read of a shard in an S3 bucket sends no request besides the ranges it needs:
no ``HEAD`` first. Inside :func:`pinned` (``Dataset.read`` opens it around a read),
:func:`fetch_ranges` asks for each span with ``If-Match: <ETag from the listing>``, so
the store itself refuses an object whose ETag moved (``412``: :class:`TagMoved`, a
:class:`~zephon_dask.errors.DataChangedError` that ``Dataset.read`` settles by content: the
same bytes uploaded again read on, pinned to the new ETag from then on, see
:func:`retagged`), and marks the pin ``confirmed``; a
read that confirmed nothing (the bytes came from a per-process cache, or the
format read through another path) is checked with one ``HEAD`` afterwards.
:func:`download` fetches a whole object the same way (the node cache).

A request costs about what a megabyte of body does, so a read's ranges at most
:data:`HOLE` apart are one ``GET`` (:func:`plan`), a span longer than :data:`PART`
is fetched in parts, and at most :data:`CONCURRENT` ``GET`` s of a read are in
flight. An object no larger than :data:`BLOCKS_BYTES` (its size known from the
pin) is read in blocks of :data:`BLOCK` bytes kept per process (:data:`BLOCKS`,
least recently used out first, keyed by name and ETag): a read fetches the blocks
it touches and lacks; one that lacks none sends one ``GET``, of its shortest
range, to ask the store whether the ETag stands, unless a conditional ``GET`` of
the object succeeded in this process less than :data:`CONFIRM_EVERY` seconds
before (a dataset's ``storage_options["confirm_every"]``, :func:`confirm_every`).
The bytes are those of the listed ETag either way; a rewritten object is refused
by the first read that asks.

Requests go through one reading client per process and set of storage options,
shared by its threads and reused across reads (its connections stay open). That client does no
retries of its own; a request is retried here, alone, after a short bounded wait:
throttling (``503 SlowDown``), other 5xx, a connection reset or closed mid-body, a
body cut short and timeouts, up to :data:`ATTEMPTS` tries (or the
``config_kwargs["retries"]["max_attempts"]`` a user set in the storage options), the
waits doubling from :data:`FIRST_WAIT` to at most :data:`LAST_WAIT` seconds with
equal jitter drawn from a hash of the request and the try. A retry asks only for
the bytes not received yet. Other requests of the read carry on meanwhile;
nothing is listed again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem

from ..errors import ConfigError, DataChangedError
from .memo import byte_lru

ATTEMPTS = 12  # tries of one range, unless the user's storage options set max_attempts
FIRST_WAIT = 0.02  # seconds before the second try of a range
LAST_WAIT = 8.0  # the longest wait between two tries; twelve tries wait 13-26 s in all
HOLE = 1 << 20  # ranges at most this far apart are one GET: a request costs about what this many bytes do
PART = 8 << 20  # the most bytes one GET asks; a longer span is fetched in parts at once
CONCURRENT = 8  # GETs of one read in flight at once
PIECE = 1 << 18  # bytes taken from a body at a time (kept when the connection breaks)
BLOCK = 1 << 16  # the unit an object no larger than BLOCKS_BYTES is fetched and kept in
BLOCKS_BYTES = 64 << 20  # per process: the blocks kept, least recently used out first
BLOCKS = byte_lru(BLOCKS_BYTES, len)  # (name, ETag, block number) -> the block's bytes
CONFIRM_EVERY = 1.0  # seconds (default): a read from kept blocks alone asks the store at most this often
CONFIRM_KEY = "confirm_every"  # the storage option setting it for a dataset (ours, never passed to fsspec)
CONFIRMED_MAX = 4096  # objects whose last confirmation is kept, least recently used out first
CONFIRMED = byte_lru(CONFIRMED_MAX, lambda _when: 1)  # (name, ETag) -> monotonic time of its last conditional GET
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                          "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                          "RequestLimitExceeded", "TooManyRequests"})


@dataclass
class Pin:
    """The object a read expects: filesystem-internal ``name``, its listed ``etag`` and ``size``
    (when known); ``confirm_every``: seconds a confirmation serves reads from kept blocks;
    ``confirmed`` once a conditional request proved the store still holds it."""

    name: str
    etag: str
    size: int | None = None
    confirm_every: float = CONFIRM_EVERY
    confirmed: bool = False


def confirm_every(storage_options: dict[str, Any] | None) -> float:
    """Seconds a read from kept blocks may go without asking the store whether the object's ETag
    stands: ``storage_options["confirm_every"]`` (``0``: every read asks), else
    :data:`CONFIRM_EVERY`. Pure."""
    value = (storage_options or {}).get(CONFIRM_KEY, CONFIRM_EVERY)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ConfigError(f"storage_options[{CONFIRM_KEY!r}] must be a number of seconds >= 0 (0: every "
                          f"read from kept blocks asks the store), got {value!r}")
    return float(value)


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
def pinned(name: str, etag: str, size: int | None = None, every: float = CONFIRM_EVERY) -> Iterator[Pin]:
    """Reads of ``name`` under this block are conditional on ``etag`` (see the module); ``size``,
    the object's listed size, lets them go through :data:`BLOCKS`; ``every``: the pin's
    ``confirm_every``."""
    pin = Pin(name, etag, size, every)
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
            # one try, no botocore backoff (its "max_attempts" counts the retries: 1 would retry once)
            config["retries"] = {"total_max_attempts": 1, "mode": "standard"}
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


def backoff(attempt: int, key: str) -> float:
    """The wait before try ``attempt + 2`` of the request ``key``: equal jitter drawn from a hash of
    both (no shared generator; requests of one read spread apart)."""
    full = min(LAST_WAIT, FIRST_WAIT * 2**attempt)
    draw = hashlib.blake2b(f"{key}\0{attempt}".encode(), digest_size=8).digest()
    return full / 2 + int.from_bytes(draw, "big") / 2**64 * full / 2


async def retried(attempts: int, url: str, pin: Pin | None, call: Any, key: str = "") -> Any:
    """``await call()``, retried as the module says (at least one try; ``key`` names the request
    for its waits); a ``412`` is the object changed."""
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
        await asyncio.sleep(backoff(attempt, key or url))
        attempt += 1


def _kwargs(fs: AbstractFileSystem, client: Any, name: str, pin: Pin | None, **extra: Any) -> dict[str, Any]:
    bucket, key = _split(name)
    kw: dict[str, Any] = {**(getattr(fs, "s3_additional_kwargs", None) or {}), "Bucket": bucket, "Key": key,
                          **extra, **(getattr(fs, "req_kw", None) or {})}
    if pin is not None:
        kw["IfMatch"] = f'"{pin.etag}"'
    accepted = client.meta.service_model.operation_model("GetObject").input_shape.members
    return {k: v for k, v in kw.items() if k in accepted}  # e.g. upload-only encryption settings


def plan(starts: list[int], ends: list[int], hole: int | None = None,
         part: int | None = None) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` byte spans to ``GET`` for the ranges ``[starts[i], ends[i])``: the non-empty
    ranges in order, merged where at most ``hole`` (:data:`HOLE`) bytes lie between them, each
    span then cut into parts of at most ``part`` (:data:`PART`) bytes, fetched at once. Pure."""
    hole = HOLE if hole is None else hole
    part = PART if part is None else part
    spans: list[list[int]] = []
    for lo, hi in sorted((lo, hi) for lo, hi in zip(starts, ends, strict=True) if hi > lo):
        if spans and lo - spans[-1][1] <= hole:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(at, min(at + part, hi)) for lo, hi in spans for at in range(lo, hi, part)]


async def _ranges(fs: AbstractFileSystem, attempts: int, name: str, pin: Pin | None,
                  starts: list[int], ends: list[int]) -> list[bytes]:
    await fs.set_session()
    client = await fs.get_s3(_split(name)[0])
    url = f"s3://{name.removeprefix('s3://')}"
    gets = plan(starts, ends)
    slots = asyncio.Semaphore(CONCURRENT)

    async def one(lo: int, hi: int) -> bytearray:
        got = bytearray()

        async def rest() -> bytearray:  # a retry asks only for the bytes not received yet
            kw = _kwargs(fs, client, name, pin, Range=f"bytes={lo + len(got)}-{hi - 1}")
            resp = await client.get_object(**kw)
            try:
                async for block in resp["Body"].iter_chunks(PIECE):
                    got.extend(block)
            finally:
                resp["Body"].close()
            if len(got) != hi - lo:
                raise ShortBody(f"{len(got)} of {hi - lo} bytes")
            return got

        async with slots:
            return await retried(attempts, url, pin, rest, key=f"{url}\0{lo}")

    blobs = await asyncio.gather(*(one(lo, hi) for lo, hi in gets))
    at = [lo for lo, _ in gets]
    out = []
    for lo, hi in zip(starts, ends, strict=True):
        if hi <= lo:
            out.append(b"")
            continue
        i = bisect.bisect_right(at, lo) - 1  # the first part holding lo; a range may run into the next
        pieces = [memoryview(blobs[i])[lo - at[i] : hi - at[i]]]
        while (n := sum(len(p) for p in pieces)) < hi - lo:
            i += 1
            pieces.append(memoryview(blobs[i])[: hi - lo - n])
        out.append(b"".join(pieces))  # the range's bytes alone, copied once
    return out


def fetch_ranges(fs: AbstractFileSystem, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
    """The bytes ``[start, end)`` of the S3 object ``name``: ranges at most :data:`HOLE` apart
    fetched in one ``GET``, at most :data:`CONCURRENT` at once (:func:`plan`), each conditional on
    the pin's ETag when one is active (``pin.confirmed`` set after). Under a pin with the object's
    size, an object no larger than :data:`BLOCKS_BYTES` is read in blocks (:func:`_blocked`)."""
    from fsspec.asyn import sync

    pin = active(fs, name)
    twin, attempts = reader(fs)
    if not any(hi > lo for lo, hi in zip(starts, ends, strict=True)):
        return [b""] * len(starts)
    if pin is not None and pin.size is not None and pin.size <= BLOCKS_BYTES:
        blobs = _blocked(twin, attempts, pin, starts, ends)
    else:
        blobs = sync(twin.loop, _ranges, twin, attempts, name, pin, starts, ends)
    if pin is not None:
        pin.confirmed = True
    return blobs


def _blocked(fs: AbstractFileSystem, attempts: int, pin: Pin, starts: list[int], ends: list[int]) -> list[bytes]:
    """:func:`fetch_ranges` through the blocks of :data:`BLOCKS`: the missing blocks the ranges
    touch are fetched (conditional, neighbours in one ``GET``) and kept; when none is missing, the
    shortest range is fetched instead, to ask the store whether the ETag stands, unless the object
    was confirmed less than the pin's ``confirm_every`` seconds ago."""
    from fsspec.asyn import sync

    assert pin.size is not None
    pairs = list(zip(starts, ends, strict=True))
    touched = sorted({k for lo, hi in pairs if hi > lo for k in range(lo // BLOCK, (hi - 1) // BLOCK + 1)})
    have: dict[int, bytes] = {}
    for k in touched:
        block = BLOCKS.get((pin.name, pin.etag, k))
        if block is not None:
            have[k] = block
    missing = [k for k in touched if k not in have]
    out: list[bytes | None] = [None] * len(pairs)
    if missing:
        lows = [k * BLOCK for k in missing]
        got = sync(fs.loop, _ranges, fs, attempts, pin.name, pin, lows, [min(lo + BLOCK, pin.size) for lo in lows])
        for k, block in zip(missing, got, strict=True):
            BLOCKS[pin.name, pin.etag, k] = have[k] = block
        CONFIRMED[pin.name, pin.etag] = time.monotonic()
    elif time.monotonic() - CONFIRMED.get((pin.name, pin.etag), -math.inf) >= pin.confirm_every:
        short = min((hi - lo, i) for i, (lo, hi) in enumerate(pairs) if hi > lo)[1]
        out[short] = sync(fs.loop, _ranges, fs, attempts, pin.name, pin, [starts[short]], [ends[short]])[0]
        CONFIRMED[pin.name, pin.etag] = time.monotonic()
    for i, (lo, hi) in enumerate(pairs):
        if out[i] is None:  # the range's piece of each block it touches
            out[i] = b"".join(have[k][max(lo - k * BLOCK, 0) : hi - k * BLOCK]
                              for k in range(lo // BLOCK, (hi - 1) // BLOCK + 1)) if hi > lo else b""
    return [b for b in out if b is not None]


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

        await retried(attempts, url, pin, rest, key=url)  # a retry resumes where the body was cut


def download(fs: AbstractFileSystem, name: str, target: str, size: int) -> None:
    """Write the ``size`` bytes of the S3 object ``name`` to the local file ``target``
    (conditional on the pin's ETag when one is active, ``pin.confirmed`` set after)."""
    from fsspec.asyn import sync

    pin = active(fs, name)
    twin, attempts = reader(fs)
    sync(twin.loop, _download, twin, attempts, name, pin, target, size)
    if pin is not None:
        pin.confirmed = True

