"""The demo job: real text from this machine's Python, streamed on an embedded LocalCluster.

It builds a two-source JSONL corpus from the standard library (module source
as ``code``, module docstrings as ``prose``; no downloads), tokenizes and packs
it on Dask workers, streams batches as torch tensors with a progress bar, and
then shows the elastic guarantee: the same global steps computed by two DP
groups hold exactly the batches the single group delivered.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from .curriculum import MixtureWorkSource
from .data import Dataset
from .pipeline import Pipeline

REPLICAS = 4


def build_corpus(out: Path, max_files: int = 400) -> Path:
    """Write ``code/*.jsonl`` and ``prose/*.jsonl`` from the stdlib (cached)."""
    if (out / "done").exists():
        return out
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:max_files]
    (out / "code").mkdir(parents=True, exist_ok=True)
    (out / "prose").mkdir(parents=True, exist_ok=True)
    code, prose = [], []
    for path in tqdm(files, desc="corpus", unit="file"):
        text = path.read_text(encoding="utf-8", errors="replace")
        code.append({"text": text, "source": path.name})
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    prose.append({"text": doc, "source": path.name})
    for name, rows in (("code", code), ("prose", prose)):
        for shard in range(4):
            with open(out / name / f"part-{shard}.jsonl", "w", encoding="utf-8") as fh:
                for row in rows[shard::4]:
                    fh.write(json.dumps(row) + "\n")
    (out / "done").write_text("ok\n")
    return out


def make_pipeline(corpus: Path, **options) -> Pipeline:
    code = Dataset.from_jsonl("code", str(corpus / "code"))
    prose = Dataset.from_jsonl("prose", str(corpus / "prose"))
    ws = MixtureWorkSource([code, prose], {"code": 0.6, "prose": 0.4}, chunk_size=64, seed=1234)
    return (
        Pipeline(ws).tokenize("bytes").shuffle(256).pack(1024, algorithm="best_fit").batch(4)
        .options(canonical_replicas=REPLICAS, flush_every_k_chunks=2, **options)
    )


def _digest(batch) -> str:
    return hashlib.sha256(batch["tokens"].tobytes()).hexdigest()


def run(workdir: str = ".zephon-demo", steps: int = 40) -> int:
    corpus = build_corpus(Path(workdir) / "corpus")
    t0 = time.perf_counter()
    seen = []
    with make_pipeline(corpus) as pipe:
        print(f"fingerprint {pipe.fingerprint()[:16]}  lanes {pipe.owned_lanes()}  runner: {pipe.runner().describe()}")
        tokens = 0
        bar = tqdm(total=steps * REPLICAS, desc="batches (dp=1)", unit="batch")
        it = iter(pipe)
        for batch in it:
            tensors = batch.to_torch()
            tokens += int((tensors["document_ids"] >= 0).sum())
            seen.append((batch.lane, batch.index_in_lane, _digest(batch)))
            bar.update(1)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - t0):,.0f}")
            if len(seen) == steps * REPLICAS:
                break
        bar.close()
        client = pipe.runner().client
        # the same global steps, served by two DP groups sharing the cluster
        regrouped = []
        for group in range(2):
            with make_pipeline(corpus, client=client, dp_degree=2, dp_group_id=group) as g:
                for batch in g:
                    regrouped.append((batch.lane, batch.index_in_lane, _digest(batch)))
                    if len(regrouped) == (group + 1) * steps * REPLICAS // 2:
                        break
    same = Counter(seen) == Counter(regrouped)
    print(f"{len(seen)} batches, {tokens:,} tokens in {time.perf_counter() - t0:.1f}s")
    print(f"dp=1 vs dp=2: the {steps} global steps hold {'the same' if same else 'DIFFERENT'} batches")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run())
