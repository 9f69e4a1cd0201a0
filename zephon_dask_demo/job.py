"""The demo job: train a small language model on this machine's Python, resume it on dp=2.

1. Builds a two-source JSONL corpus from the standard library (module source
   as ``code``, docstrings as ``prose``; no downloads) and trains a byte-level
   BPE tokenizer on a slice of it; both are cached in the work folder.
2. Phase 1, dp=1: the pipeline tokenizes, shuffles and packs on an embedded
   Dask ``LocalCluster`` and streams global batches into a small causal
   transformer; at ``resume_at`` it checkpoints the data state and the model.
3. Phase 2, dp=2 (or another degree): as many DP groups as the new degree, in
   this process and on the same cluster, resume from the checkpoint; each
   global step concatenates every group's batches, so the model sees the
   global batch a dp=1 run would show it.
4. An uninterrupted dp=1 run (data only) writes a reference ledger, and the
   two ledgers are compared step by step.

It uses zephon_dask's public API only. :func:`run` holds every piece of state
(the work folder's files, the cluster, the model and optimizer); the corpus and
tokenizer builders are deterministic given the Python installation.
"""

from __future__ import annotations

import ast
import json
import shutil
import sysconfig
import time
from contextlib import ExitStack
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from zephon_dask import (
    ConfigError,
    Dataset,
    MixtureWorkSource,
    Pipeline,
    load_state,
    save_state,
    verify_ledgers,
)
from zephon_dask.log import dashboard_link_shown
from zephon_dask.pipeline.ranks import owned_lanes
from zephon_dask.state import read_ledger

REPLICAS = 4  # lanes: a run may resume on any DP degree dividing it
MICROBATCH = 2  # rows per batch: a global step is REPLICAS * MICROBATCH rows
SEQ_LEN = 512
VOCAB = 4096
SPECIAL_TOKENS = ("<pad>", "<|endoftext|>")  # ids 0 (padding) and 1 (EOS, found by .tokenize)
IGNORE_INDEX = -100
MODEL_FIELDS = ("input_ids", "labels", "positions", "document_ids", "loss_mask")


def build_corpus(out: Path, max_files: int = 400) -> Path:
    """Write ``code/*.jsonl`` and ``prose/*.jsonl`` from the stdlib (cached per ``max_files``)."""
    marker = out / "done"
    if marker.exists() and json.loads(marker.read_text()) == {"max_files": max_files}:
        return out
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:max_files]
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
    marker.write_text(json.dumps({"max_files": max_files}))
    print(f"corpus: {len(code)} modules as code, {len(prose)} docstrings as prose -> {out}")
    return out


def _corpus_slice(corpus: Path, budget: int):
    """Up to ``budget`` characters of each source's texts, in shard order."""
    for name in ("code", "prose"):
        left = budget
        for shard in sorted((corpus / name).glob("*.jsonl")):
            for line in shard.read_text(encoding="utf-8").splitlines():
                if left <= 0:
                    break
                text = json.loads(line)["text"]
                left -= len(text)
                yield text


def train_tokenizer(corpus: Path, path: Path, vocab_size: int = VOCAB, budget: int = 1_000_000) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on a slice of the corpus (reused while newer)."""
    if path.exists() and path.stat().st_mtime >= (corpus / "done").stat().st_mtime:
        print(f"tokenizer: {path} (cached)")
        return path
    from tokenizers import decoders, models, pre_tokenizers, trainers

    t0 = time.perf_counter()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_corpus_slice(corpus, budget), trainer)
    tokenizer.save(str(path))
    print(f"tokenizer: byte-level BPE, vocab {tokenizer.get_vocab_size()}, trained in "
          f"{time.perf_counter() - t0:.1f}s -> {path}")
    return path


def make_pipeline(corpus: Path, tokenizer: Path, **options) -> Pipeline:
    code = Dataset.from_jsonl("code", str(corpus / "code"), progress=False)
    prose = Dataset.from_jsonl("prose", str(corpus / "prose"), progress=False)
    ws = MixtureWorkSource([code, prose], {"code": 0.6, "prose": 0.4}, chunk_size=4, seed=1234)
    return (
        Pipeline(ws)
        .tokenize(str(tokenizer), eos=True)
        .shuffle(64)
        .pack(SEQ_LEN, algorithm="best_fit")
        .batch(MICROBATCH, labels=True, mask_document_boundaries=True)
        .options(canonical_replicas=REPLICAS, flush_every_k_chunks=2, **options)
    )


class Block(nn.Module):
    """Pre-norm transformer block; attention is causal and stays inside each packed document."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A 2-layer causal transformer over packed rows (positions restart at each document)."""

    def __init__(self, vocab: int, d_model: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(SEQ_LEN, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # small, since the output head shares it
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, input_ids, positions, document_ids) -> torch.Tensor:
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        mask = (causal & (document_ids[:, :, None] == document_ids[:, None, :]))[:, None]
        x = self.embed(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x) @ self.embed.weight.T  # tied output head


def global_batches(groups, batches_per_step: int):
    """Global steps: ``batches_per_step`` batches of each DP group, in group order, as one batch."""
    streams = [iter(group.to_torch()) for group in groups]
    while True:
        try:
            parts = [next(s) for s in streams for _ in range(batches_per_step)]
        except StopIteration:
            return
        yield {k: torch.cat([p[k] for p in parts]) for k in MODEL_FIELDS}


def train(model, optimizer, batches, steps: int, desc: str) -> float:
    """``steps`` optimizer steps with a progress bar (loss, trained tokens/s); the last loss."""
    bar = tqdm(total=steps, desc=desc, unit="step")
    tokens, loss, t0 = 0, float("nan"), time.perf_counter()
    for batch in islice(batches, steps):
        logits = model(batch["input_ids"], batch["positions"], batch["document_ids"])
        step_loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        step_loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss, tokens = step_loss.item(), tokens + int(batch["loss_mask"].sum())
        bar.set_postfix_str(f"loss {loss:.3f}, {tokens / (time.perf_counter() - t0):,.0f} tok/s", refresh=False)
        bar.update()
    bar.close()
    if bar.n != steps:
        raise RuntimeError(f"{desc}: the stream ended after {bar.n} of {steps} steps")
    return loss


def _new_model(vocab: int):
    torch.manual_seed(0)
    model = TinyLM(vocab)
    return model, torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)


def _check(steps: int, resume_at: int, dp_after: int) -> None:
    if steps < 2:
        raise ConfigError(f"steps={steps} must be at least 2: some before the checkpoint, some after")
    if not 1 <= resume_at < steps:
        raise ConfigError(f"resume_at={resume_at} must lie in 1..{steps - 1} (steps={steps})")
    if dp_after < 1 or REPLICAS % dp_after:
        divisors = [d for d in range(1, REPLICAS + 1) if REPLICAS % d == 0]
        raise ConfigError(f"dp_after={dp_after} must divide the demo's {REPLICAS} lanes: one of {divisors}")


def run(workdir: str = ".zephon-demo", steps: int = 40, resume_at: int | None = None,
        dp_after: int = 2, max_files: int = 400) -> int:
    """The whole demo; returns 0 when the resumed run's global steps match the uninterrupted run's."""
    resume_at = steps // 2 if resume_at is None else resume_at
    _check(steps, resume_at, dp_after)
    t_start = time.perf_counter()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(work / "corpus", max_files)
    tokenizer = train_tokenizer(corpus, work / "tokenizer.json")
    runs, ckpt = work / "runs", work / "ckpt"
    shutil.rmtree(runs, ignore_errors=True)  # ledgers append: start each demo afresh
    elastic, reference = runs / "elastic", runs / "uninterrupted"
    torch.set_num_threads(1)  # the other core runs a Dask worker

    with ExitStack() as stack:
        stack.enter_context(dashboard_link_shown())  # printed once, when the cluster starts
        pipe = stack.enter_context(make_pipeline(corpus, tokenizer, batches_per_step=REPLICAS,
                                                 ledger=str(elastic)))
        runner = pipe.session.runner()  # starts the embedded LocalCluster (the first windows are computed here meanwhile)
        print(f"pipeline {pipe.fingerprint()[:16]}: {REPLICAS} lanes, rows of {SEQ_LEN} tokens, "
              f"global step = {REPLICAS} batches x {MICROBATCH} rows")
        vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
        model, optimizer = _new_model(vocab)
        print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
              f"vocab {vocab}, CPU")

        # phase 1: dp=1 until the checkpoint
        loss = train(model, optimizer, global_batches([pipe], REPLICAS), resume_at, "train dp=1")
        runner.client  # noqa: B018 (waits for the cluster's start, bounded by cluster_timeout)
        print(f"dask: {runner.describe()}; {len(runner.computed_here)} window(s) computed in this process "
              "while it started")
        state = pipe.state_dict()
        save_state(ckpt / "data.json", state)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "global_step": resume_at}, ckpt / "model.pt")
        print(f"checkpoint at global step {state['step']['global_step']} (loss {loss:.3f}) -> "
              f"{ckpt}/data.json, model.pt")
        for lane, p in state["lanes"].items():
            print(f"  lane {lane}: {p['batches_delivered']} batches delivered, next sample "
                  f"window {p['window']} offset {p['offset']}")

        # phase 2: resume everything from the files on dp=dp_after, same cluster
        client = runner.client
        groups = [
            stack.enter_context(
                make_pipeline(corpus, tokenizer, client=client, dp_degree=dp_after, dp_group_id=g,
                              batches_per_step=REPLICAS // dp_after, ledger=str(elastic))
                .load_state_dict(load_state(ckpt / "data.json"))
            )
            for g in range(dp_after)
        ]
        saved = torch.load(ckpt / "model.pt", weights_only=True)
        model, optimizer = _new_model(vocab)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        print(f"resume on dp={dp_after}: groups own lanes "
              + " | ".join(str(owned_lanes(g.description.settings)) for g in groups))
        train(model, optimizer, global_batches(groups, REPLICAS // dp_after), steps - resume_at,
              f"train dp={dp_after}")

        # the reference: the same pipeline, dp=1, never interrupted (data only)
        ref = stack.enter_context(make_pipeline(corpus, tokenizer, client=client,
                                                batches_per_step=REPLICAS, ledger=str(reference)))
        for _ in tqdm(islice(iter(ref), steps * REPLICAS), total=steps * REPLICAS,
                      desc="reference dp=1", unit="batch"):
            pass
    # every pipeline (and with the first, the cluster) is closed here; ledgers are flushed

    same, report = verify_ledgers(reference, elastic)
    covered = set(read_ledger(reference)) == set(read_ledger(elastic)) == set(range(steps))
    print(f"zephon-dask verify {reference} {elastic}: {report}")
    if same and covered:
        print(f"dp=1 -> checkpoint at step {resume_at} -> dp={dp_after}: global steps 0..{steps - 1} "
              f"match the uninterrupted run ({steps * REPLICAS} batches) "
              f"[{time.perf_counter() - t_start:.0f}s]")
        return 0
    print(f"MISMATCH: the resumed run's global steps differ from the uninterrupted run's "
          f"(or do not cover 0..{steps - 1})")
    return 1

