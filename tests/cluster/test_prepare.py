"""prepare_tokens on real Dask clusters: exact tokens, resumability, refusals, the CLI."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path

import fsspec
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

import zephon_dask as z
from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import child_pids, wait_until_no_new_processes
from zephon_dask import compute_window
from zephon_dask.cli import main as cli_main
from zephon_dask.data import write_token_store
from zephon_dask.errors import (
    ConfigError,
    DataFormatError,
    IncompleteStoreError,
    MissingFieldError,
    TokenizerMismatchError,
    ZephonError,
)
from zephon_dask.jobs.prepare import token_dtype, tokenize_shard
from zephon_dask.operators import Tokenize

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()
# Shard files: "sub/" sorts after "part-*", and part-2 is empty (kept as an empty shard).
SHARDS = {"part-0.jsonl": 40, "part-1.jsonl": 35, "part-2.jsonl": 0, "sub/part-3.jsonl": 30}


def texts_for(prefix: str, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        f"{prefix}/{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 60))))
        for i in range(n)
    ]


def write_jsonl_corpus(fs, root: str) -> dict[str, list[str]]:
    """The corpus as ``{shard id: texts}``, written under ``root`` on ``fs``."""
    out = {}
    for k, (rel, n) in enumerate(SHARDS.items()):
        texts = texts_for(f"web {k}", n, k)
        fs.makedirs(os.path.dirname(f"{root}/{rel}"), exist_ok=True)
        with fs.open(f"{root}/{rel}", "w") as f:
            f.write("".join(json.dumps({"text": t}) + "\n" for t in texts))
        out[rel] = texts
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus") / "web"
    texts = write_jsonl_corpus(fsspec.filesystem("file"), str(root))
    return root, texts


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        with Client(lc, set_as_default=False) as client:
            yield client


@pytest.fixture(scope="module")
def bpe_store(corpus, bpe, cluster, tmp_path_factory):
    """The JSONL corpus prepared with the BPE tokenizer (BOS and EOS) on the 2-worker cluster."""
    ds = z.Dataset.from_jsonl("web", str(corpus[0]), progress=False)
    out = str(tmp_path_factory.mktemp("stores") / "web-bpe")
    report = z.prepare_tokens(ds, Tokenize(bpe, bos=True, eos=True), out, client=cluster, progress=False)
    return ds, out, report


def hf_oracle(path: str, texts: list[str], bos: bool, eos: bool) -> list[list[int]]:
    """Tokenization one document at a time with ``tokenizers`` itself."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    pre = [tok.token_to_id("<s>")] if bos else []
    post = [tok.token_to_id("</s>")] if eos else []
    return [pre + tok.encode(t, add_special_tokens=False).ids + post for t in texts]


def store_docs(out: str, storage_options=None) -> dict[str, list[list[int]]]:
    """Every document of a store, read with zarr directly: ``{store shard id: [ids]}``."""
    root = zarr.open_group(out, mode="r", storage_options=storage_options)
    docs = {}
    for sid in root.attrs["shards"]:
        tok, off = root[f"shards/{sid}/tokens"][:], root[f"shards/{sid}/offsets"][:]
        docs[sid] = [tok[a:b].tolist() for a, b in zip(off[:-1], off[1:])]
    return docs


def records(out: str) -> dict[str, dict | None]:
    root = zarr.open_group(out, mode="r")
    return {sid: dict(root[f"shards/{sid}"].attrs).get("record") for sid in root.attrs["shards"]}


# ----------------------------------------------------------------------------- exactness


def test_two_workers_equal_single_process_tokenization(corpus, bpe, bpe_store):
    root, texts = corpus
    ds, out, report = bpe_store
    got = store_docs(out)
    assert list(got) == ["00000", "00001", "00002", "00003"]  # input shard order, empty shard kept
    for sid, shard in zip(got, ds.shards):
        assert got[sid] == hf_oracle(bpe, texts[shard.shard_id], bos=True, eos=True)
    assert report.computed == tuple(got) and report.reused == ()
    assert report.num_docs == sum(SHARDS.values())
    assert report.num_tokens == sum(len(d) for docs in got.values() for d in docs)
    attrs = zarr.open_group(out, mode="r").attrs
    assert attrs["complete"] is True and attrs["version"] == 1 and attrs["dtype"] == "uint16"
    assert attrs["tokenizer"] == Tokenize(bpe, bos=True, eos=True).spec()  # the tokenizer's hash in it
    assert attrs["source"] == ds.identity()
    assert [r["source"]["shard_id"] for r in records(out).values()] == [s.shard_id for s in ds.shards]
    store = report.dataset
    assert store.format == "tokens" and store.shard_sizes == ds.shard_sizes
    assert store.read(0, [0])[0]["tokens"].dtype == np.uint16


def test_dtype_follows_the_vocabulary(bpe):
    from tokenizers import Tokenizer, models, pre_tokenizers

    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0"))
    big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert token_dtype(Tokenize("bytes")) == np.uint16
    assert token_dtype(Tokenize(bpe, bos=True)) == np.uint16
    assert token_dtype(Tokenize(big, eos_id=1)) == np.uint32
    assert token_dtype(Tokenize(lambda t: [1], eos_id=1, version=1)) == np.uint32  # range unknown


def test_embedded_cluster_parquet_uint32_and_nothing_left_running(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0"))
    big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    rng = np.random.default_rng(0)
    (tmp_path / "pq").mkdir()
    texts = {}
    for f in range(3):
        texts[f"f{f}.parquet"] = [" ".join(f"w{w}" for w in rng.integers(0, 70_000, rng.integers(1, 30)))
                                  for _ in range(25)]
        pq.write_table(pa.table({"body": texts[f"f{f}.parquet"]}), tmp_path / "pq" / f"f{f}.parquet",
                       row_group_size=7)
    ds = z.Dataset.from_parquet("pq", tmp_path / "pq", text_field="body", progress=False)
    before = child_pids()
    report = z.prepare_tokens(ds, Tokenize(big, field="body", eos_id=3), str(tmp_path / "out"),
                              n_workers=2, progress=False)
    wait_until_no_new_processes(before)  # the embedded cluster is gone
    got = store_docs(str(tmp_path / "out"))
    for sid, shard in zip(got, ds.shards):
        assert got[sid] == [[int(w[1:]) for w in t.split()] + [3] for t in texts[shard.shard_id]]
    assert report.dataset.read(0, [0])[0]["tokens"].dtype == np.uint32
    assert zarr.open_group(str(tmp_path / "out"), mode="r")["shards/00000/tokens"].dtype == np.uint32


def test_store_pipeline_packs_like_the_raw_text_pipeline(corpus, bpe, bpe_store):
    ds, out, _ = bpe_store

    def pipe(dataset, tokenize):
        ws = z.MixtureWorkSource([dataset], chunk_size=12, seed=3)
        p = z.Pipeline(ws)
        if tokenize:
            p = p.tokenize(bpe, bos=True, eos=True)
        return (p.shuffle(8).pack(48, algorithm="best_fit").batch(3)
                .options(runner="synchronous", canonical_replicas=4, flush_every_k_chunks=2))

    raw = pipe(ds, tokenize=True)
    stored = pipe(z.Dataset.from_tokens("web", out, tokenizer=Tokenize(bpe)), tokenize=False)
    windows = [(lane, w) for lane in range(4) for w in range(raw.spec.num_windows(lane))]
    assert len(windows) > 4
    assert [compute_window(stored.spec, *lw).digest() for lw in windows] == \
        [compute_window(raw.spec, *lw).digest() for lw in windows]
    with raw, stored:
        a = [batch_rows(b) for b in raw]
        b = [batch_rows(b) for b in stored]
    assert len(a) > 5 and a == b


def test_records_with_truncation_match_the_truncating_pipeline(cluster, tmp_path):
    data = {"a": texts_for("a", 30, 7), "b": texts_for("b", 25, 8)}
    ds = z.Dataset.from_records("mem", data)
    report = z.prepare_tokens(ds, Tokenize("bytes", bos=True, max_length=40), str(tmp_path / "store"),
                              client=cluster, progress=False)
    full = [len(t.encode()) + 2 for shard in data.values() for t in shard]
    assert report.truncated_tokens == sum(n - 40 for n in full if n > 40) > 0
    assert report.num_tokens == sum(min(n, 40) for n in full)

    def pipe(dataset, tokenize):
        p = z.Pipeline(z.MixtureWorkSource([dataset], chunk_size=8, seed=1))
        if tokenize:
            p = p.tokenize("bytes", bos=True, max_length=40)
        return p.pack(32).options(canonical_replicas=2, flush_every_k_chunks=2)

    raw, stored = pipe(ds, True), pipe(report.dataset, False)
    windows = [(lane, w) for lane in range(2) for w in range(raw.spec.num_windows(lane))]
    assert [compute_window(stored.spec, *lw).digest() for lw in windows] == \
        [compute_window(raw.spec, *lw).digest() for lw in windows]


# ------------------------------------------------------------------------ resumability


def test_interrupted_run_is_refused_then_finished_redoing_only_bad_shards(corpus, cluster, tmp_path):
    root, texts = corpus
    ds = z.Dataset.from_jsonl("web", str(root), progress=False)
    sentinel = tmp_path / "fail"
    sentinel.write_text("")
    flag = str(sentinel)

    def flaky(text):  # breaks on the second shard while the sentinel file exists
        if text.startswith("web 1/") and os.path.exists(flag):
            raise RuntimeError("tokenizer broke on purpose")
        return list(text.encode("utf-8"))

    out = str(tmp_path / "store")
    op = Tokenize(flaky, eos=False, name="flaky", version=1)
    kw = dict(client=cluster, progress=False)
    with pytest.raises(RuntimeError, match="on purpose") as ei:
        z.prepare_tokens(ds, op, out, **kw)
    assert any("00001" in n and "rerun prepare_tokens" in n for n in ei.value.__notes__)
    recs = records(out)
    assert recs["00001"] is None and all(recs[s] is not None for s in ("00000", "00002", "00003"))
    for read in (z.Dataset.from_tokens, z.Dataset.from_path):
        with pytest.raises(IncompleteStoreError, match="Rerun zephon_dask.prepare_tokens") as e2:
            read("web", out)
        assert isinstance(e2.value, DataFormatError) and isinstance(e2.value, ValueError)
    # damage a finished shard too: its record stays, its data no longer hashes to it
    chunk = Path(out) / "shards" / "00000" / "tokens" / "c" / "0"
    chunk.write_bytes(b"garbage" + chunk.read_bytes()[7:])
    sentinel.unlink()
    again = z.prepare_tokens(ds, op, out, **kw)
    assert again.computed == ("00000", "00001")
    assert again.reused == ("00002", "00003")
    got = store_docs(out)
    for sid, shard in zip(got, ds.shards):
        assert got[sid] == [list(t.encode()) for t in texts[shard.shard_id]]
    third = z.prepare_tokens(ds, op, out, **kw)
    assert third.computed == () and len(third.reused) == 4
    assert z.Dataset.from_tokens("web", out).num_samples == sum(SHARDS.values())
    # a complete store with a damaged shard: only that shard is written again
    (Path(out) / "shards" / "00003" / "offsets" / "c" / "0").unlink()
    fourth = z.prepare_tokens(ds, op, out, **kw)
    assert fourth.computed == ("00003",) and store_docs(out) == got


def test_killed_worker_mid_job_still_gives_a_complete_store(corpus, cluster, tmp_path):
    root, texts = corpus
    ds = z.Dataset.from_jsonl("web", str(root), progress=False)
    out = tmp_path / "store"
    free, gate = tmp_path / "free-worker", tmp_path / "gate"

    def slow(text):
        """The first worker process to tokenize runs freely; the other waits at the gate (opened
        once a worker is killed; at most 60 s), so a shard is running when another is recorded."""
        try:
            with open(free, "x") as f:
                f.write(str(os.getpid()))
        except FileExistsError:
            pass
        deadline = time.monotonic() + 60
        while free.read_text() != str(os.getpid()) and not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(text.encode("utf-8"))

    pids = cluster.run(os.getpid)
    killed = []
    finished = threading.Event()

    def assassin():  # once one shard is recorded, kill a worker that is running another
        deadline = time.time() + 30
        while not finished.is_set() and time.time() < deadline:
            done = any('"record"' in p.read_text() for p in out.glob("shards/*/zarr.json"))
            busy = [w for w, keys in sorted(cluster.processing().items())
                    if any(k.startswith("zephon-tokenize-shard") for k in keys)]
            if done and busy:
                os.kill(pids[busy[0]], signal.SIGKILL)
                killed.append(pids[busy[0]])
                gate.touch()
                return
            time.sleep(0.02)

    thread = threading.Thread(target=assassin)
    thread.start()
    try:
        report = z.prepare_tokens(ds, Tokenize(slow, eos=False, name="slow", version=1), str(out),
                                  client=cluster, progress=False)
    finally:
        finished.set()
        gate.touch()
        thread.join(60)
    assert killed, "no worker was killed while the job ran"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == psutil.STATUS_ZOMBIE
    assert zarr.open_group(str(out), mode="r").attrs["complete"] is True
    got = store_docs(str(out))
    for sid, shard in zip(got, ds.shards):
        assert got[sid] == [list(t.encode()) for t in texts[shard.shard_id]]
    assert report.num_docs == sum(SHARDS.values())
    cluster.wait_for_workers(2, timeout=60)


def test_rerun_of_a_finished_shard_task_leaves_its_files_untouched(corpus, tmp_path):
    """A task rerun after its worker died (the result was lost, the files were not) must
    not empty a shard that the driver may be verifying at that moment."""
    root, texts = corpus
    ds = z.Dataset.from_jsonl("web", str(root), progress=False)
    op = Tokenize(lambda t: list(t.encode("utf-8")), "text", split_long=False, eos=False,
                  name="bytes", version=1)
    url, source = str(tmp_path / "shard"), {"shard_id": ds.shards[0].shard_id}
    first = tokenize_shard(ds, op, "uint32", None, 0, url, source)
    files = sorted(p for p in Path(url).rglob("*") if p.is_file())
    for p in files:  # stamped in the past: a file written again shows whatever the clock's resolution
        os.utime(p, ns=(10**18, 10**18))
    stamps = {p: p.stat().st_mtime_ns for p in files}
    assert tokenize_shard(ds, op, "uint32", None, 0, url, source) == first
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    # a damaged one is written again
    (Path(url) / "offsets" / "c" / "0").unlink()
    assert tokenize_shard(ds, op, "uint32", None, 0, url, source) == first
    assert (Path(url) / "offsets" / "c" / "0").exists()


def test_each_completed_forgets_a_task_once_its_result_is_read(cluster):
    """Otherwise the scheduler reruns a finished task when the worker holding its result dies."""
    from zephon_dask.execution.connect import each_completed

    def work(delay, i):
        time.sleep(delay * i)
        return i

    tag = uuid.uuid4().hex
    keys = [f"test-each-{tag}-{i}" for i in range(2)]
    tasks = each_completed(cluster, work, (1.0,), [(0,), (1,)], keys, f"test-shared-{tag}")
    with closing(tasks):
        # task 0 usually finishes first; on a busy machine (or one worker holding both) task 1 may
        index, result, error = next(tasks)
        assert (result, error) == (index, None)
        known = lambda dask_scheduler, key=keys[index]: key in dask_scheduler.tasks  # noqa: E731
        deadline = time.time() + 10
        while cluster.run_on_scheduler(known) and time.time() < deadline:
            time.sleep(0.02)
        assert not cluster.run_on_scheduler(known)
        assert next(tasks) == (1 - index, 1 - index, None)


# ---------------------------------------------------------------------------- refusals


def test_store_from_another_tokenizer_is_refused(bpe, bpe_store, corpus, tmp_path):
    ds, out, _ = bpe_store
    assert z.Dataset.from_tokens("web", out, tokenizer=Tokenize(bpe)).num_samples == ds.num_samples
    assert z.Dataset.from_tokens("web", out, tokenizer=Tokenize(bpe).tokenizer).num_samples == ds.num_samples
    with pytest.raises(TokenizerMismatchError, match="huggingface") as ei:
        z.Dataset.from_tokens("web", out, tokenizer=Tokenize("bytes"))
    assert isinstance(ei.value, ConfigError) and isinstance(ei.value, ValueError)
    assert out in str(ei.value)
    with pytest.raises(TokenizerMismatchError):
        z.Dataset.from_path("web", out, tokenizer=Tokenize("bytes"))
    with pytest.raises(ConfigError, match="pass the Tokenize operator"):
        z.Dataset.from_tokens("web", out, tokenizer=bpe)  # a bare spec: the data layer cannot resolve it
    write_token_store(str(tmp_path / "plain"), {"a": [np.arange(3)]}, {"sha256": "abc"})
    with pytest.raises(TokenizerMismatchError, match="None"):
        z.Dataset.from_tokens("p", tmp_path / "plain", tokenizer=Tokenize("bytes"))
    # preparing into it with other settings is refused before any work starts
    with pytest.raises(TokenizerMismatchError, match="delete it or give another out path"):
        z.prepare_tokens(ds, Tokenize("bytes"), out, address="tcp://127.0.0.1:1", progress=False)
    with pytest.raises(ConfigError, match="differ"):
        other = z.Dataset.from_jsonl("other", str(corpus[0]), progress=False)
        z.prepare_tokens(other, Tokenize(bpe, bos=True, eos=True), out, address="tcp://127.0.0.1:1",
                         progress=False)


def test_bad_inputs_fail_at_call_time(bpe_store, corpus, tmp_path):
    ds, out, _ = bpe_store
    nowhere = {"address": "tcp://127.0.0.1:1", "progress": False}  # a cluster would never answer
    op = Tokenize("bytes")
    cases = [
        (lambda: z.prepare_tokens(z.Dataset.from_tokens("t", out), op, str(tmp_path / "a"), **nowhere),
         ConfigError, "already a token store"),
        (lambda: z.prepare_tokens(ds, Tokenize("bytes", field="body"), str(tmp_path / "b"), **nowhere),
         MissingFieldError, "'body'"),
        (lambda: z.prepare_tokens(ds, op, str(corpus[0]), **nowhere),
         ConfigError, "not a token store"),
        (lambda: z.prepare_tokens(ds, op, str(corpus[0] / "part-0.jsonl"), **nowhere),
         ConfigError, "is a file"),
        (lambda: z.prepare_tokens(ds, op, str(tmp_path / "c"), n_workers=0, **nowhere),
         ConfigError, "n_workers"),
        (lambda: z.prepare_tokens([ds], op, str(tmp_path / "d"), **nowhere),
         ConfigError, "needs a zephon_dask.Dataset"),
        (lambda: z.prepare_tokens(ds, "bytes", str(tmp_path / "e"), **nowhere),
         ConfigError, r"needs a Tokenize operator, got str; build one with zephon_dask\.Tokenize"),
        (lambda: z.prepare_tokens(ds, Tokenize("bytes", max_length=8, split_long=True),
                                  str(tmp_path / "f"), **nowhere),
         ConfigError, "split_long=True"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text) as ei:
            call()
        assert isinstance(ei.value, ZephonError)
    assert not any((tmp_path / d).exists() for d in "bcef")


# ------------------------------------------------------------------- memory:// and the CLI


def test_memory_urls_run_on_an_in_process_cluster(bpe, corpus, cluster):
    fs = fsspec.filesystem("memory")
    root = f"/zephon-prepare-{uuid.uuid4().hex}"
    try:
        texts = write_jsonl_corpus(fs, f"{root}/web")
        ds = z.Dataset.from_jsonl("web", f"memory://{root}/web", progress=False)
        before = child_pids()
        report = z.prepare_tokens(ds, Tokenize(bpe), f"memory://{root}/store", n_workers=2,
                                  progress=False)
        assert child_pids() <= before  # workers were threads of this process
        got = store_docs(f"memory://{root}/store")
        for sid, shard in zip(got, ds.shards):
            assert got[sid] == hf_oracle(bpe, texts[shard.shard_id], bos=False, eos=True)
        store = z.Dataset.from_path("web", f"memory://{root}/store", tokenizer=Tokenize(bpe))
        assert store.shard_sizes == ds.shard_sizes and report.dataset.identity() == store.identity()
        # worker processes have memories of their own: the store is never marked complete
        with pytest.raises(DataFormatError, match="not visible here"):
            z.prepare_tokens(z.Dataset.from_jsonl("web", str(corpus[0]), progress=False),
                             Tokenize(bpe), f"memory://{root}/elsewhere", client=cluster, progress=False)
        assert zarr.open_group(f"memory://{root}/elsewhere", mode="r").attrs["complete"] is False
    finally:
        fs.rm(root, recursive=True)


def test_cli_prepares_every_recipe_dataset(corpus, bpe, cluster, tmp_path, capsys):
    rel_tok = os.path.relpath(bpe, tmp_path)
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"body": ["alpha beta", "gamma"]}), tmp_path / "pq" / "a.parquet")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"""
[[datasets]]
name = "web"
path = "{corpus[0]}"
weight = 3

[[datasets]]
name = "small"
path = "pq"
format = "parquet"
text_field = "body"
weight = 1

[tokenize]
tokenizer = "{rel_tok}"
bos = true
""")
    argv = ["prepare", str(recipe), "--out", str(tmp_path / "stores"), "--address",
            cluster.scheduler.address, "--no-progress"]
    assert cli_main(argv) == 0
    assert "4 shards tokenized" in capsys.readouterr().out
    for name in ("web", "small"):
        store = z.Dataset.from_tokens(name, tmp_path / "stores" / name, tokenizer=Tokenize(bpe))
        assert store.tokenizer_meta["bos_id"] is not None
    # [tokenize] names no field: each dataset's text field is tokenized
    assert z.Dataset.from_tokens("small", tmp_path / "stores" / "small").tokenizer_meta["field"] == "body"
    assert cli_main(argv) == 0
    assert "4 verified and kept" in capsys.readouterr().out
    recipe.write_text(recipe.read_text() + "split_long = true\n")
    assert cli_main(argv) == 2
    assert "split_long" in capsys.readouterr().err


def test_the_data_layer_imports_no_operators_jobs_or_dask():
    """Read statically: importing zephon_dask.data runs the package's __init__, which imports more."""
    import ast

    banned = ("zephon_dask.operators", "zephon_dask.execution", "zephon_dask.jobs", "dask", "distributed")
    found = []
    for path in sorted((Path(z.__file__).parent / "data").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "zephon_dask" if node.level == 2 else "zephon_dask.data" if node.level == 1 else ""
                names = [".".join(p for p in (base, node.module) if p)]
            else:
                continue
            found += [(path.name, n) for n in names if n.startswith(banned)]
    assert found == []
