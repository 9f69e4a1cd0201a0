"""What a user's operator (``add_op``) costs against the built-in doing the same work.

Two pipelines over ``bench_e2e.py``'s synthetic prose (``--quick``: a fifth), the bytes
tokenizer, ``shuffle`` and ``pack``, differing only in how two steps are given:

* built-in: ``.map(lowercase)`` and ``.shuffle(1024)``;
* add_op: ``.add_op(Lowercase())`` (a ``RecordOp`` calling the same function) and
  ``.add_op(Shuffled(1024))`` (an ``Accumulator`` calling the built-in shuffle), and a
  ``map_batch`` that returns its batch unchanged.

Alternated rounds (``--rounds``, default 3), timed in this process without Dask:

* ``record op alone``: the operator over every chunk's records, read beforehand,
  :data:`REPEAT` times (``Map.apply_chunk`` against the ``add_op`` wrapper's);
* ``whole run``: the pipeline iterated to its end on the synchronous runner (every window
  read, through the operators and packed, every batch cut; the ``map_batch`` runs there).

Times are this process's CPU seconds (``time.process_time``: the synchronous runner computes
here), steadier than wall time on a shared machine. Prints each round's seconds, the median and the ratio add_op / built-in with its range
over the rounds. Nothing is asserted.

    python benchmarks/bench_ops.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from bench_e2e import write_corpus

import zephon_dask as z
from zephon_dask.core.window import read_chunk
from zephon_dask.operators.base import ChunkContext, Row
from zephon_dask.operators.shuffle import Shuffle

REPEAT = 20  # passes over the chunks per round for the record operator alone


def lowercase(record: dict) -> dict:
    return {**record, "text": record["text"].lower()}


class Lowercase(z.RecordOp):
    name = "lowercase"
    one_to_one = True

    def spec(self) -> dict:
        return {"op": self.name}

    def apply(self, record: dict) -> list[dict]:
        return [lowercase(record)]


class Shuffled(z.Accumulator):
    name = "shuffled"
    one_to_one = True

    def __init__(self, buffer_size: int):
        self.buffer_size = buffer_size

    def spec(self) -> dict:
        return {"op": self.name, "buffer_size": self.buffer_size}

    def apply(self, table, ctx):
        return Shuffle(self.buffer_size).apply(table, ctx)


def same(batch: dict) -> dict:
    return batch


def pipelines(data: str) -> dict[str, z.Pipeline]:
    source = z.MixtureWorkSource([z.Dataset.from_jsonl("prose", data, progress=False)], chunk_size=64, seed=0)
    builtin = z.Pipeline(source).map(lowercase).tokenize().shuffle(1024)
    custom = z.Pipeline(source).add_op(Lowercase()).tokenize().add_op(Shuffled(1024))
    return {"built-in": builtin.pack(2048).batch(4).options(canonical_replicas=4, runner="synchronous"),
            "add_op": custom.pack(2048).batch(4).map_batch(same).options(canonical_replicas=4, runner="synchronous")}


def time_record_op(pipe: z.Pipeline, chunks: list) -> float:
    op = pipe.spec.record_ops[0]
    names = pipe.spec.source.names
    t = time.process_time()
    for g, pointers, records in chunks * REPEAT:
        op.apply_chunk([Row(i, 0, r) for i, r in enumerate(records)], ChunkContext(g, names, pointers))
    return time.process_time() - t


def time_run(pipe: z.Pipeline) -> float:
    t = time.process_time()
    with pipe:
        for _ in pipe:  # every window computed, every batch cut (for add_op, through map_batch)
            pass
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "prose")
        os.makedirs(data)
        info = write_corpus(data, int((8 if args.quick else 40) * 1e6), None)
        pipes = pipelines(data)
        spec = pipes["built-in"].spec
        chunks = [(g, *read_chunk(spec, g)) for g in range(spec.source.num_chunks)]
        print(f"corpus: {info['docs']:,} documents, {info['bytes'] / 1e6:.1f} MB, {len(chunks)} chunks; "
              f"{args.rounds} alternated rounds")
        for label, fn in (("record op alone", lambda p: time_record_op(p, chunks)), ("whole run", time_run)):
            times: dict[str, list[float]] = {name: [] for name in pipes}
            for _ in range(args.rounds):
                for name in pipes:  # alternated: the same conditions for both, round by round
                    times[name].append(fn(pipelines(data)[name] if label == "whole run" else pipes[name]))
            for name, ts in times.items():
                print(f"  {label:16s} {name:9s} " + " ".join(f"{t:7.3f}" for t in ts)
                      + f"  median {statistics.median(ts):.3f} s")
            ratios = [c / b for b, c in zip(times["built-in"], times["add_op"], strict=True)]
            print(f"  {label:16s} add_op / built-in: median {statistics.median(ratios):.3f} "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
