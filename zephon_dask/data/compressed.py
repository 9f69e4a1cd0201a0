"""Random access into gzip- and zstd-compressed files, without decompressing them whole each time.

:func:`codec` sniffs a file's magic bytes (the extension is not trusted).
:func:`decompress` streams a file once, yielding its decompressed blocks and
recording *checkpoints*: ``(compressed offset, decompressed offset, decoder
state)`` triples from which decoding can restart. For gzip a checkpoint is a
copy of the zlib state (its 32 KiB window included) taken every
:data:`CHECKPOINT_EVERY` compressed bytes; for zstd, which cannot copy its
state, a checkpoint is the start of each frame (a file written as one frame has
one checkpoint, so it is decoded whole once per process, then served from the
segment cache).

:func:`read_ranges` returns decompressed byte ranges: it decodes the
*segments* (checkpoint to next checkpoint) covering them and keeps decoded
segments in a per-process LRU (:data:`SEGMENTS`), so reading a chunk costs at
most about one segment of extra decoding. Checkpoints live in the caller's
per-process cache; nothing here is pickled. Pure apart from reading the file
and :data:`SEGMENTS`.
"""

from __future__ import annotations

import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fsspec import AbstractFileSystem

from ..errors import ConfigError, DataFormatError
from .integrity import changed
from .memo import byte_lru

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_UNSUPPORTED = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip"}
CHECKPOINT_EVERY = 1 << 20  # compressed bytes between gzip checkpoints
_READ = 1 << 20
SEGMENTS = byte_lru(1 << 28, len)


def codec(head: bytes, url: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None`` (plain) from a file's first bytes; other codecs are refused."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    for magic, name in _UNSUPPORTED.items():
        if head.startswith(magic):
            raise DataFormatError(
                f"{url!r} is {name}-compressed, which zephon_dask does not read; decompress it or "
                "recompress it with gzip or zstd (.jsonl.gz / .jsonl.zst)"
            )
    return None


@dataclass(frozen=True)
class Checkpoints:
    """Where decoding of one compressed file can restart (process-local: holds decoder states)."""

    codec: str
    compressed: np.ndarray  # int64 byte offsets into the compressed file
    decompressed: np.ndarray  # int64 byte offsets into the decompressed stream
    states: tuple[Any, ...]  # zlib decoder copies (gzip) or None (zstd: a frame starts there)
    size: int  # decompressed size

    @property
    def nbytes(self) -> int:
        """Rough memory held (a zlib state with its window is about 40 KiB)."""
        return 16 * len(self.states) + (45_000 * len(self.states) if self.codec == "gzip" else 0)


def _gzip_decoder() -> Any:
    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def zstandard() -> Any:
    """The ``zstandard`` module; a ConfigError saying how to install it when it is missing."""
    try:
        import zstandard as module
    except ImportError:
        raise ConfigError(
            "reading zstd-compressed data needs the zstandard package: "
            "pip install 'zephon_dask[formats]'"
        ) from None
    return module


def _zstd_decoder() -> Any:
    return zstandard().ZstdDecompressor().decompressobj(read_across_frames=False)


def _corrupt(url: str, name: str, at: int, exc: BaseException) -> DataFormatError:
    return DataFormatError(
        f"{url!r}: corrupt {name} data near compressed byte {at} ({exc}); the file is damaged: "
        "download or compress it again"
    )


def _truncated(url: str, name: str, at: int) -> DataFormatError:
    return DataFormatError(
        f"{url!r}: the {name} stream ends early (truncated at compressed byte {at}); the file was "
        "cut short (an interrupted copy or download): fetch or compress it again"
    )


def decompress(fs: AbstractFileSystem, name: str, url: str, kind: str, out: list) -> Iterator[bytes]:
    """Yield the decompressed blocks of the file ``name``; append its :class:`Checkpoints` to ``out``.

    Raises DataFormatError naming ``url`` and the compressed offset for corrupt or
    truncated data.
    """
    comp, decomp, states = [0], [0], [None]
    new = _gzip_decoder if kind == "gzip" else _zstd_decoder
    dec = new()
    if kind == "gzip":
        states[0] = dec.copy()
    pos = total = 0
    member_open = False
    with fs.open(name, "rb") as fh:
        while block := fh.read(min(_READ, CHECKPOINT_EVERY)):
            data = block
            while data:
                at = pos + len(block) - len(data)
                if kind == "zstd" and not member_open and at > 0:  # a new frame starts here
                    comp.append(at)
                    decomp.append(total)
                    states.append(None)
                try:
                    piece = dec.decompress(data)
                except Exception as exc:  # zlib.error / zstandard.ZstdError
                    raise _corrupt(url, kind, at, exc) from None
                member_open = True
                total += len(piece)
                if piece:
                    yield piece
                if not dec.eof:
                    break
                data = dec.unused_data  # a frame / gzip member ended inside this block
                member_open = False
                dec = new()
            pos += len(block)
            if kind == "gzip" and pos - comp[-1] >= CHECKPOINT_EVERY:
                comp.append(pos)
                decomp.append(total)
                states.append(dec.copy())
    if member_open and not dec.eof:
        raise _truncated(url, kind, pos)
    if pos == 0:
        raise _truncated(url, kind, 0)
    out.append(
        Checkpoints(kind, np.array(comp, np.int64), np.array(decomp, np.int64), tuple(states), total)
    )


def head(fs: AbstractFileSystem, name: str, url: str, kind: str, block: int = 1 << 16) -> Generator[bytes, None, None]:
    """Decompressed blocks of at most ``block`` bytes from the start of the file, decoding only as
    far as they are consumed (a file's first record, read at construction). DataFormatError for
    corrupt data."""
    at = 0
    with fs.open(name, "rb", block_size=block) as fh:  # not a remote store's 50 MiB block
        try:
            if kind == "zstd":
                reader = zstandard().ZstdDecompressor().stream_reader(fh, read_size=block, read_across_frames=True)
                while piece := reader.read(block):
                    yield piece
                return
            dec, data = _gzip_decoder(), b""
            while True:
                data = data or fh.read(block)
                at += len(data)
                if not data:
                    return
                piece = dec.decompress(data, block)  # at most one block out, the rest kept
                data = dec.unconsumed_tail
                if dec.eof:  # the next gzip member
                    data, dec = dec.unused_data, _gzip_decoder()
                if piece:
                    yield piece
        except Exception as exc:  # zlib.error / zstandard.ZstdError
            raise _corrupt(url, kind, at, exc) from None


def _segment(fs: AbstractFileSystem, name: str, url: str, cp: Checkpoints, k: int) -> bytes:
    """Decoded bytes from checkpoint ``k`` to checkpoint ``k + 1`` (or the end), cached."""
    key = (url, cp.size, int(cp.compressed[-1]), k)
    hit = SEGMENTS.get(key)
    if hit is not None:
        return hit
    lo = int(cp.compressed[k])
    hi = int(cp.compressed[k + 1]) if k + 1 < len(cp.states) else None
    want = (int(cp.decompressed[k + 1]) if k + 1 < len(cp.states) else cp.size) - int(
        cp.decompressed[k]
    )
    raw = fs.cat_file(name, start=lo, end=hi)
    dec = cp.states[k].copy() if cp.codec == "gzip" else _zstd_decoder()
    parts, data = [], raw
    try:
        while data:
            parts.append(dec.decompress(data))
            if not dec.eof:
                break
            data = dec.unused_data
            dec = _gzip_decoder() if cp.codec == "gzip" else _zstd_decoder()
    except Exception as exc:  # the file changed or went bad since it was indexed
        raise _corrupt(url, cp.codec, lo, exc) from None
    out = b"".join(parts)
    if len(out) != want:
        raise changed(None, url, f"decompressing from compressed byte {lo} gave {len(out)} "
                                 f"bytes, not the {want} indexed")
    SEGMENTS[key] = out
    return out


def read_ranges(
    fs: AbstractFileSystem, name: str, url: str, cp: Checkpoints, lo: np.ndarray, hi: np.ndarray
) -> list[bytes]:
    """The decompressed bytes ``[lo[i], hi[i])`` of the file, each range a separate bytes object."""
    out = []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        first = int(np.searchsorted(cp.decompressed, a, side="right")) - 1
        last = int(np.searchsorted(cp.decompressed, max(a, b - 1), side="right")) - 1
        base = int(cp.decompressed[first])
        buf = b"".join(_segment(fs, name, url, cp, k) for k in range(first, last + 1))
        out.append(buf[a - base : b - base])
    return out
