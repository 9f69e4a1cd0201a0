"""The chunk size a pipeline chooses when its work source leaves it open (``chunk_size=None``). Pure.

The rule: the largest power of two ``c <= DEFAULT_CHUNK_SIZE`` (1,024) at which the
stream has at least ``canonical_replicas`` chunks, so every lane gets one (each
block of ``R`` chunks gives each lane one), and at which the mixture stays valid
(``c * w_max >= components - 1``). When no such ``c`` gives every lane a chunk (a
corpus with fewer samples than lanes), the valid power of two with the most chunks.
A large corpus keeps 1,024, so its data and fingerprint are those of the default.

The choice reads the sample counts, the weights, the stop policy (through the stream
length) and ``canonical_replicas``, all data settings; never an execution setting.
It does not aim at whole flush windows per lane: a lane's first window holds all its
chunks either way, and smaller chunks would only flush more often (more of pack's
tail dropped, a shorter shuffle span) without giving any lane more work.

A source with a chunk size given, with a schedule (its phases count chunks of
1,024), or weighted by tokens and not yet measured keeps its own.
"""

from __future__ import annotations

from ..errors import ConfigError
from .mixture import Mixture
from .work_source import DEFAULT_CHUNK_SIZE, MixtureWorkSource


def candidates(source: MixtureWorkSource) -> list[int]:
    """The powers of two the choice considers, largest first: at most 1,024, at least the
    mixture's smallest valid chunk size."""
    floor = Mixture.min_chunk_size(source.weights)
    sizes = []
    size = DEFAULT_CHUNK_SIZE
    while size >= max(1, floor):
        sizes.append(size)
        size //= 2
    return sizes


def stream_chunks(source: MixtureWorkSource, chunk_size: int) -> int | None:
    """Chunks in ``source``'s stream at ``chunk_size`` (``None``: endless; 0: no chunk fits)."""
    if chunk_size == source.chunk_size and source.chooses_chunk_size:  # an open source keeps a stream of none
        return source.num_chunks
    try:
        return source.with_chunk_size(chunk_size).num_chunks
    except ConfigError:  # a valid candidate is refused only for having no chunk
        return 0


def choose_chunk_size(source: MixtureWorkSource, replicas: int) -> int:
    """The chunk size the rule (module docstring) gives ``source``'s data and ``replicas`` lanes,
    whatever chunk size ``source`` has. ``source`` has no schedule and is measured."""
    sizes = candidates(source)
    if not sizes:
        return source.chunk_size
    counts = []
    for size in sizes:
        chunks = stream_chunks(source, size)
        if chunks is None or chunks >= replicas:
            return size
        counts.append(chunks)
    return sizes[max(range(len(sizes)), key=lambda i: (counts[i], -i))]


def fitted(source: MixtureWorkSource, replicas: int) -> MixtureWorkSource:
    """``source`` with its chunk size chosen for ``replicas`` lanes if it leaves it open (a new
    source, or itself when the choice is the default or nothing is chosen)."""
    if not source.chooses_chunk_size or source.unmeasured:
        return source
    size = choose_chunk_size(source, replicas)
    if size == source.chunk_size and source.num_chunks != 0:
        return source
    return source.with_chunk_size(size)  # refused if even this size gives the stream no chunk


def chosen_note(source: MixtureWorkSource, replicas: int) -> str:
    """How ``explain()`` says an open chunk size was chosen (``source``: the one it ran with)."""
    return (f"chosen from the data: {sum(source.sizes):,} samples, {replicas} lanes; "
            "set chunk_size= to fix it")
