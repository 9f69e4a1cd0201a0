"""Helpers the tests share: small real corpora, the consumer-side pipeline, child processes."""

from __future__ import annotations

import json
from collections.abc import Callable

import psutil

import zephon_dask as z
from zephon_dask.core.window import Made

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


class FakeSpec:
    """A stand-in spec for the window fetcher's unit tests: what a fetcher reads of a spec: windows per lane, the fingerprint, a window's chunks."""

    fingerprint = "0" * 64

    def __init__(self, num_windows: dict):
        self.windows = num_windows

    def num_windows(self, lane):
        return self.windows[lane]

    def window_chunks(self, lane, window):
        return []


class FakeWindow(tuple):
    """A stand-in window for the fetcher's unit tests: its ``(lane, window)``, and what the fetcher
    reads of a window besides (:class:`~zephon_dask.core.window.Made`: ``cpu`` seconds)."""

    def __new__(cls, pair, cpu: float = 0.0):
        out = super().__new__(cls, pair)
        out.made = Made(cpu=cpu)
        return out


def write_corpus(root, n_files=3, docs=60, seed=0, prefix="doc"):
    import random

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        with open(root / f"part-{f}.jsonl", "w") as fh:
            for i in range(docs):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 80)))
                fh.write(json.dumps({"text": f"{prefix} {f}/{i} {words}"}) + "\n")
    return root


def build(corpus_dir, seed=5, R=4, k=2, microbatch=3, algorithm="first_fit", **options):
    """The two-dataset pipeline; ``microbatch=None`` leaves ``.batch()`` to the caller (it is set once)."""
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
    ws = z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=12, seed=seed)
    pipe = z.Pipeline(ws).tokenize().shuffle(16).pack(96, algorithm=algorithm)
    if microbatch is not None:
        pipe = pipe.batch(microbatch)
    return pipe.options(canonical_replicas=R, flush_every_k_chunks=k, **options)




def child_pids() -> set[int]:
    """Child processes, except Python's own resource tracker (it lives as long as we do)."""
    out = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(c.cmdline()):
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for(condition: Callable[[], object], limit: float, every: float = 0.01) -> bool:
    """Poll ``condition()`` every ``every`` seconds until it is true or ``limit`` seconds have
    passed; its last value, as a bool (the caller asserts what it needs)."""
    import time

    deadline = time.monotonic() + limit
    while not (met := bool(condition())) and time.monotonic() < deadline:
        time.sleep(every)
    return met


def wait_until_no_new_processes(before: set[int], limit: float = 30.0) -> None:
    """Poll until every child process not in ``before`` has ended (a cluster that was still
    starting is closed in the background); ``AssertionError`` naming them after ``limit`` seconds."""
    import time

    deadline = time.monotonic() + limit
    while (left := child_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left {limit:g} s after close: {sorted(left)}"
