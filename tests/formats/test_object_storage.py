"""Data in object storage: every format read from a real S3-protocol server on 127.0.0.1 (moto's
server, through s3fs) gives the records and batches that the same files on local disk give."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import zephon_dask as z
from tests.cluster.test_faults_cluster import dask_cluster
from tests.formats.test_formats_mds import own_write, samples
from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import write_corpus
from tests.helpers.s3server import KEY, SECRET, FaultProxy, S3Server
from zephon_dask.data import (
    Dataset,
    memo,
    remote,
    write_token_store,
)
from zephon_dask.errors import DatasetNotFoundError, StorageAccessError, StorageError

pytest.importorskip("s3fs")
pytest.importorskip("moto")
datasets = pytest.importorskip("datasets")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow  # a real S3-protocol server in a process of its own


@pytest.fixture(scope="session")
def s3():
    """One moto S3 server for the session (started once, stopped at the end)."""
    with S3Server() as server:
        yield server


def write_formats(root) -> dict[str, str]:
    """One small dataset per format under ``root``: ``{name: path relative to root}``."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"doc {i} " + "w" * (i % 37), "i": i}) + "\n" for i in range(300)]
    (root / "plain").mkdir()
    (root / "plain" / "a.jsonl").write_text("".join(lines[:170]))
    (root / "plain" / "b.jsonl").write_text("\n".join(lines[170:]))  # blank lines between
    (root / "gz").mkdir()
    (root / "gz" / "a.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
    (root / "zst").mkdir()
    frames = [zstandard.ZstdCompressor().compress("".join(lines[i : i + 64]).encode())
              for i in range(0, len(lines), 64)]
    (root / "zst" / "a.jsonl.zst").write_bytes(b"".join(frames))
    (root / "pq").mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": [f"row {k}/{i} " + "p" * (i % 11) for i in range(90)],
                                 "n": list(range(90))}), root / "pq" / f"p{k}.parquet", row_group_size=16)
    datasets.Dataset.from_dict({"text": [f"hf {i} " + "h" * (i % 7) for i in range(120)],
                                "id": list(range(120))}).save_to_disk(str(root / "hf"), num_shards=3)
    own_write(root / "mds", samples(80), 30, None)
    own_write(root / "mdsz", samples(50, seed=1), 20, "zstd")
    rng = np.random.default_rng(3)
    write_token_store(str(root / "tok"), {
        f"s{k}": [rng.integers(0, 1000, int(rng.integers(1, 40))).astype(np.uint16) for _ in range(60)]
        for k in range(2)
    }, {"name": "test"}, vocab_size=1000)
    return {"plain": "plain", "gz": "gz/a.jsonl.gz", "zst": "zst/a.jsonl.zst", "pq": "pq",
            "hf": "hf", "mds": "mds", "mdsz": "mdsz", "tok": "tok"}


def records(ds: Dataset, seed: int = 0, chunk: int = 7) -> list:
    """Every record, read in shuffled chunks of up to ``chunk`` offsets (arrays made lists)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(ds.shard_sizes):
        order = rng.permutation(n)
        for lo in range(0, n, chunk):
            for r in ds.read(i, order[lo : lo + chunk]):
                out.append({k: (v.dtype.str, v.tolist()) if isinstance(v, np.ndarray) else v
                            for k, v in r.items()})
    return out


@pytest.fixture(scope="module")
def bucket(s3, tmp_path_factory):
    """The datasets of :func:`write_formats` on disk and in the bucket ``formats``."""
    local = tmp_path_factory.mktemp("formats")
    paths = write_formats(local)
    fs = s3.filesystem()
    fs.mkdir("formats")
    fs.put(str(local) + "/", "formats/", recursive=True)
    return local, paths


def test_every_format_reads_from_the_bucket_as_from_disk(s3, bucket):
    local, paths = bucket
    opts = s3.options()
    for name, rel in paths.items():
        here = Dataset.from_path(name, str(local / rel), progress=False)
        there = Dataset.from_path(name, f"s3://formats/{rel}", storage_options=opts, progress=False)
        assert there.format == here.format
        assert there.identity() == here.identity(), name  # sizes and counts; no path, no endpoint
        assert records(there) == records(here), name
        assert all(s.etag for s in there.shards) or there.format == "tokens"
        assert all(s.parts for s in there.shards) or there.format != "arrow"  # read by byte ranges


def test_a_gzip_file_in_a_bucket_is_read_as_gzip(s3, bucket):
    """A regression: the codec sniff asked s3fs for bytes 0..8 positionally (s3fs's third
    positional argument of cat_file is the start, not the end) and read gzip as plain text."""
    local, _ = bucket
    there = Dataset.from_jsonl("gz", "s3://formats/gz/a.jsonl.gz", storage_options=s3.options(),
                               progress=False)
    assert len(there) == 300 and there.read(0, [299])[0]["i"] == 299


def test_a_rewritten_object_is_refused_by_its_etag(s3, tmp_path):
    fs = s3.filesystem()
    fs.mkdir("changing")
    fs.pipe("changing/a.jsonl", b'{"text": "one"}\n{"text": "two"}\n')
    every = s3.options(confirm_every=0)  # every read asks the store, even one from kept blocks
    ds = Dataset.from_jsonl("c", "s3://changing/a.jsonl", storage_options=every, progress=False)
    assert ds.read(0, [1]) == [{"text": "two"}]
    fs.pipe("changing/a.jsonl", b'{"text": "uno"}\n{"text": "dos"}\n')  # same size, new ETag
    with pytest.raises(z.DataChangedError, match="ETag"):
        ds.read(0, [1])
    again = Dataset.from_jsonl("c", "s3://changing/a.jsonl", storage_options=s3.options(), progress=False)
    assert again.read(0, [1]) == [{"text": "dos"}]


def upload_in_parts(fs, key: str, body: bytes) -> None:
    """Upload ``body`` to ``key`` as a one-part multipart upload: the same bytes as a plain
    upload, but an ETag that is no MD5 of them (``<md5 of the parts' md5s>-1``)."""
    bucket, name = key.split("/", 1)
    up = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=name)
    part = fs.call_s3("upload_part", Bucket=bucket, Key=name, UploadId=up["UploadId"], PartNumber=1, Body=body)
    fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=name, UploadId=up["UploadId"],
               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    fs.invalidate_cache()


def test_an_object_uploaded_again_with_the_same_bytes_reads_on(s3):
    fs = s3.filesystem()
    fs.mkdir("again")
    body = b"".join(b'{"text": "doc %d"}\n' % i for i in range(50))
    fs.pipe("again/a.jsonl", body)
    every = s3.options(confirm_every=0)  # every read asks the store, even one from kept blocks
    ds = Dataset.from_jsonl("a", "s3://again/a.jsonl", storage_options=every, progress=False)
    assert ds.read(0, [3]) == [{"text": "doc 3"}]
    upload_in_parts(fs, "again/a.jsonl", body)  # a new ETag and LastModified, the same bytes
    assert fs.info("again/a.jsonl")["ETag"].strip('"') != ds.shards[0].etag
    assert ds.read(0, [4]) == [{"text": "doc 4"}]  # the MD5 of the bytes is the ETag indexed
    fs.pipe("again/a.jsonl", body)  # a plain upload again: its ETag is the one indexed
    assert ds.read(0, [5]) == [{"text": "doc 5"}]
    upload_in_parts(fs, "again/a.jsonl", body.replace(b"doc 7", b"doc 8"))  # same size, other bytes
    with pytest.raises(z.DataChangedError, match="content differs"):
        ds.read(0, [6])


def _pipeline(web, code, **options):
    ws = z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=12, seed=7)
    return (z.Pipeline(ws).tokenize().shuffle(16).pack(96).batch(3)
            .options(canonical_replicas=4, flush_every_k_chunks=2, **options))


def _batches(pipeline, n: int) -> list:
    with pipeline:
        return [batch_rows(b) for _, b in zip(range(n), pipeline)]


def test_cluster_workers_read_the_bucket_and_prepared_tokens_round_trip(s3, tmp_path):
    """A pipeline on the embedded cluster (no head start: every window on a worker) reading the
    bucket gives the local batches; prepare_tokens writes a store into the bucket, read back."""
    write_corpus(tmp_path / "web", 2, 40, 1, "web")
    write_corpus(tmp_path / "code", 1, 30, 2, "code")
    fs = s3.filesystem()
    fs.mkdir("corpus")
    fs.put(str(tmp_path) + "/", "corpus/", recursive=True)
    opts = s3.options()

    def local(name):
        return Dataset.from_jsonl(name, str(tmp_path / name), progress=False)

    def remote(name):
        return Dataset.from_jsonl(name, f"s3://corpus/{name}", storage_options=opts, progress=False)

    want = _batches(_pipeline(local("web"), local("code"), runner="synchronous"), 12)
    got = _batches(_pipeline(remote("web"), remote("code"), n_workers=2, head_start=False), 12)
    assert got == want

    op = z.Tokenize("bytes", eos=True)
    report = z.prepare_tokens(remote("web"), op, "s3://corpus/web-tokens", storage_options=opts,
                              n_workers=2, progress=False)
    store = Dataset.from_tokens("web", "s3://corpus/web-tokens", storage_options=opts, progress=False)
    mine = z.prepare_tokens(local("web"), op, str(tmp_path / "web-tokens"), progress=False).dataset
    assert store.identity() == report.dataset.identity() == mine.identity()
    assert records(store) == records(mine)


def test_recipe_with_s3_paths_runs_through_the_cli(s3, tmp_path):
    """`zephon-dask run` on the embedded cluster streams a recipe whose dataset is in a bucket;
    the secret in its storage_options is in no output, ledger line or checkpoint."""
    write_corpus(tmp_path / "web", 2, 30, 4, "web")
    fs = s3.filesystem()
    fs.mkdir("recipe")
    fs.put(str(tmp_path / "web") + "/", "recipe/web/", recursive=True)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"""
[[datasets]]
name = "web"
path = "s3://recipe/web/"
storage_options = {{ endpoint_url = "{s3.url}", key = "{KEY}", secret = "{SECRET}" }}

[source]
chunk_size = 8
seed = 3

[tokenize]
tokenizer = "bytes"

[pack]
max_length = 128

[batch]
microbatch_size = 2

[options]
canonical_replicas = 2
flush_every_k_chunks = 2
n_workers = 1
head_start = false
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    def run(out, *extra):
        proc = subprocess.run(
            [sys.executable, "-m", "zephon_dask.cli", "run", str(recipe), "--steps", "3",
             "--ledger", str(out / "ledger"), "--checkpoint", str(out / "ck.json"), *extra],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ledger = "".join(p.read_text() for p in sorted((out / "ledger").iterdir()))
        seen = proc.stdout + proc.stderr + (out / "ck.json").read_text() + ledger
        assert SECRET not in seen
        return sorted(json.dumps({k: r[k] for k in ("lane", "index_in_lane", "sha256")})
                      for r in map(json.loads, ledger.splitlines()))

    (tmp_path / "embedded").mkdir()
    (tmp_path / "address").mkdir()
    embedded = run(tmp_path / "embedded")
    with dask_cluster(tmp_path, 1) as (address, _, _):  # a `dask scheduler` and a `dask worker`
        assert run(tmp_path / "address", "--address", address) == embedded


def forget() -> None:
    """Empty every per-process read cache, as in a fresh worker: reads go to the store again."""
    memo.clear_all()


def test_faults_of_the_store_are_retried_and_change_no_record(s3, bucket, tmp_path):
    """Through a proxy answering 503 SlowDown, resetting connections mid-body and delaying
    responses, every format reads what the local files hold; a store that never stops
    throttling is a StorageError naming the URL, after the retries."""
    local, paths = bucket
    with FaultProxy(s3.url, slowdown=0.1, reset=0.1, delay=0.05, delay_s=0.1, seed=1) as proxy:
        opts = s3.options(endpoint=proxy.url)
        for name in ("gz", "pq", "hf", "mds", "tok"):
            rel = paths[name]
            forget()
            here = Dataset.from_path(name, str(local / rel), progress=False)
            there = Dataset.from_path(name, f"s3://formats/{rel}", storage_options=opts, progress=False,
                                      cache_dir=tmp_path / "index")
            assert records(there, chunk=40) == records(here, chunk=40), name
        assert proxy.faults["slowdown"] > 0 and proxy.faults["reset"] > 0 and proxy.faults["delay"] > 0
    with FaultProxy(s3.url, slowdown=1.0) as proxy:
        opts = s3.options(endpoint=proxy.url, config_kwargs={"retries": {"max_attempts": 2}})
        with pytest.raises(StorageError, match="s3://formats/plain/a.jsonl.*reduce your request rate") as e:
            Dataset.from_jsonl("p", "s3://formats/plain/a.jsonl", storage_options=opts, progress=False)
        assert SECRET not in str(e.value)


def test_missing_or_refused_data_is_a_typed_error_at_construction(s3, bucket):
    import boto3

    opts = s3.options()
    with pytest.raises(DatasetNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        Dataset.from_jsonl("x", "s3://no-such-bucket/a.jsonl", storage_options=opts, progress=False)
    with pytest.raises(DatasetNotFoundError, match="s3://formats/plain/nope.jsonl"):
        Dataset.from_jsonl("x", "s3://formats/plain/nope.jsonl", storage_options=opts, progress=False)
    fs = s3.filesystem()
    fs.mkdir("private")
    fs.pipe("private/a.jsonl", b'{"text": "no"}\n')
    iam = boto3.client("iam", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id=KEY,
                       aws_secret_access_key=SECRET)
    iam.create_user(UserName="reader")
    made = iam.create_access_key(UserName="reader")["AccessKey"]
    allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": [
        "arn:aws:s3:::formats", "arn:aws:s3:::formats/*"]}]}
    iam.put_user_policy(UserName="reader", PolicyName="formats", PolicyDocument=json.dumps(allow))
    reader = {"key": made["AccessKeyId"], "secret": made["SecretAccessKey"], "endpoint_url": s3.url}
    s3.set_auth(0)  # from now on moto checks signatures and policies
    try:
        assert len(Dataset.from_jsonl("ok", "s3://formats/plain/a.jsonl", storage_options=reader,
                                      progress=False)) == 170
        cases = {
            "denied": ("s3://private/a.jsonl", reader, "Access Denied"),
            "wrong secret": ("s3://formats/plain/a.jsonl", {**reader, "secret": SECRET}, "signature"),
            "unknown key": ("s3://formats/plain/a.jsonl", {**reader, "key": "AKIANOSUCHKEY"}, "Key Id"),
        }
        for what, (url, options, says) in cases.items():
            with pytest.raises(StorageAccessError, match=says) as e:
                Dataset.from_jsonl("x", url, storage_options=options, progress=False)
            assert url in str(e.value) and "credentials" in str(e.value), what
            assert SECRET not in str(e.value) and made["SecretAccessKey"] not in str(e.value), what
            assert isinstance(e.value, PermissionError)
    finally:
        s3.set_auth(float("inf"))


def test_credentials_never_leave_the_storage_options(s3, bucket, tmp_path, caplog):
    """The secret in storage_options is in no fingerprint, state, ledger line, log line, explain(),
    repr, notebook view, stats or error message; the fingerprint is the local files' one."""
    local, _ = bucket
    opts = s3.options()

    def pipeline(where, **so):
        web = Dataset.from_path("web", f"{where}/plain", progress=False, **so)
        code = Dataset.from_path("code", f"{where}/pq", progress=False, **so)
        return _pipeline(web, code, runner="synchronous", ledger=str(tmp_path / "ledger"))

    caplog.set_level(logging.DEBUG, logger="zephon_dask")
    remote = pipeline("s3://formats", storage_options=opts)
    assert remote.fingerprint() == pipeline(str(local)).fingerprint()
    with remote:
        for _, _b in zip(range(4), remote):
            pass
        seen = [json.dumps(remote.state_dict()), str(remote.explain()), repr(remote), str(remote.stats()),
                remote.fingerprint()]
    ds = remote.spec.source.datasets[0]
    seen += [repr(ds), ds._repr_html_(), ds.chosen_files(), json.dumps(ds.identity()), caplog.text]
    seen += [p.read_text() for p in (tmp_path / "ledger").iterdir()]
    fs = s3.filesystem()
    fs.pipe("formats/plain/a.jsonl", fs.cat_file("formats/plain/a.jsonl") + b"\n")
    forget()
    with pytest.raises(z.DataChangedError) as e:
        ds.read(0, [0])
    seen.append(str(e.value))
    with pytest.raises(DatasetNotFoundError) as e2:
        Dataset.from_path("gone", "s3://formats/plain/none.jsonl", storage_options=opts, progress=False)
    seen.append(str(e2.value))
    assert all(SECRET not in text for text in seen)
    assert all(s3.url not in text for text in seen[:-2])  # nor the endpoint


def test_a_fresh_process_fetches_byte_ranges_not_whole_objects(s3, bucket, tmp_path, monkeypatch):
    """A worker's first read of a plain JSONL object (its line spans kept on the node at indexing)
    or a raw MDS shard fetches the records' ranges, not the object (objects too large to be
    read in blocks: these small ones would be one block)."""
    monkeypatch.setattr(remote, "BLOCKS_BYTES", 0)
    fs = s3.filesystem()
    with FaultProxy(s3.url) as proxy:
        opts = s3.options(endpoint=proxy.url)
        for url, offsets in (("s3://formats/plain/a.jsonl", [150, 151]), ("s3://formats/mds", [10, 11])):
            ds = Dataset.from_path("r", url, storage_options=opts, progress=False, cache_dir=tmp_path)
            shard = ds.shards[1 if "mds" in url else 0]
            forget()  # a fresh worker on this node
            proxy.reset_counts()
            ds.read(1 if "mds" in url else 0, offsets)
            assert 0 < proxy.body_bytes < fs.size(shard.path.removeprefix("s3://")) / 4, url


def test_a_read_is_one_get_per_range_and_no_head(s3, tmp_path, monkeypatch):
    """Reading records from a bucket sends one GET per range of nearby records and nothing else (the
    sizes and ETags come from the listing); each GET is conditional on the listed ETag, so a
    rewritten object is refused by the read itself. Reads from other threads reuse the
    connections. With the node cache: one GET of the object, then no request. (Ranges 64 KiB
    apart are fetched apart here, and the object is too large to be read in blocks.)"""
    monkeypatch.setattr(remote, "HOLE", 1 << 16)
    monkeypatch.setattr(remote, "BLOCKS_BYTES", 0)
    fs = s3.filesystem()
    fs.mkdir("counted")
    lines = [json.dumps({"text": f"{i} " + "x" * 40_000}) + "\n" for i in range(12)]  # > GAP apart
    fs.pipe("counted/a.jsonl", "".join(lines).encode())
    with FaultProxy(s3.url) as proxy:
        opts = s3.options(endpoint=proxy.url)
        ds = Dataset.from_jsonl("c", "s3://counted/a.jsonl", storage_options=opts, progress=False,
                                cache_dir=tmp_path / "index")
        for offsets, ranges in (([0, 3, 6, 9], 4), ([2, 1], 1), ([11, 10, 0], 2)):
            forget()
            proxy.reset_counts()
            got = ds.read(0, offsets)
            assert [int(r["text"].split()[0]) for r in got] == offsets
            assert proxy.methods == {"GET": ranges}, offsets
        proxy.reset_counts()
        for _ in range(3):  # reads from other threads, one after the other: the connections are reused
            t = threading.Thread(target=lambda: [ds.read(0, [0, 3, 6, 9]) for _ in range(2)])
            t.start()
            t.join(timeout=120)
            assert not t.is_alive()
        assert proxy.methods == {"GET": 24} and proxy.connections <= 6  # one client per thread: 12
        cached = Dataset.from_jsonl("c", "s3://counted/a.jsonl", progress=False, cache_dir=tmp_path / "index",
                                    storage_options={**opts, "node_cache": {"dir": str(tmp_path / "node"),
                                                                            "max_bytes": 1 << 30}})
        proxy.reset_counts()
        assert cached.read(0, [5])[0]["text"].startswith("5 ") and proxy.methods == {"GET": 1}
        proxy.reset_counts()
        assert cached.read(0, [7])[0]["text"].startswith("7 ") and proxy.requests == 0
        fs.pipe("counted/a.jsonl", "".join(lines).replace("x", "y").encode())  # same size, new ETag
        proxy.reset_counts()
        with pytest.raises(z.DataChangedError, match="ETag"):
            ds.read(0, [0, 3])
        # refused by the GETs; one HEAD then tells the same bytes uploaded again from a change
        assert proxy.methods == {"GET": 2, "HEAD": 1}


def test_a_small_object_is_read_in_kept_blocks_and_each_read_asks_its_etag(s3, tmp_path, monkeypatch):
    """An object no larger than remote.BLOCKS_BYTES is fetched in blocks kept by the process: a read
    fetches the blocks it touches and lacks (neighbours in one GET); a read whose blocks are all
    kept still sends one GET, of its shortest range, conditional on the ETag, so a rewritten
    object is refused by every read (with storage_options' confirm_every=0: every read asks)."""
    monkeypatch.setattr(remote, "BLOCK", 1 << 14)
    fs = s3.filesystem()
    fs.mkdir("blocks")
    lines = [json.dumps({"text": f"{i} " + "x" * (10_000 + i)}) + "\n" for i in range(40)]
    body = "".join(lines).encode()
    fs.pipe("blocks/a.jsonl", body)
    ends = np.cumsum([len(line) for line in lines])
    with FaultProxy(s3.url) as proxy:
        ds = Dataset.from_jsonl("b", "s3://blocks/a.jsonl", progress=False, cache_dir=tmp_path,
                                storage_options=s3.options(endpoint=proxy.url, confirm_every=0))
        forget()
        for offsets, fetched in (([0, 1, 2], 2 << 14), ([39, 0, 1], len(body) - (int(ends[38]) >> 14 << 14)),
                                 ([1, 39], len(lines[1]) - 1)):
            proxy.reset_counts()
            assert [r["text"] for r in ds.read(0, offsets)] == [json.loads(lines[i])["text"] for i in offsets]
            assert proxy.methods == {"GET": 1} and proxy.body_bytes == fetched, offsets
        fs.pipe("blocks/a.jsonl", body.replace(b"x", b"y"))  # same size, new ETag
        with pytest.raises(z.DataChangedError, match="ETag"):
            ds.read(0, [1, 39])


def test_kept_blocks_ask_the_store_at_most_once_per_confirm_every(s3, tmp_path):
    """A read served from kept blocks alone sends no request while the object was confirmed by a
    conditional GET less than storage_options' confirm_every seconds before (default 1), and gives
    the bytes of the listed ETag even once the object was rewritten; the first read that asks again
    (here through the same Dataset with confirm_every=0) refuses the rewrite. Bad values are
    refused when the Dataset is built."""
    fs = s3.filesystem()
    fs.mkdir("confirmed")
    lines = [json.dumps({"text": f"{i} " + "x" * 2_000}) + "\n" for i in range(30)]
    body = "".join(lines).encode()
    fs.pipe("confirmed/a.jsonl", body)
    want = [json.loads(line)["text"] for line in lines]
    with FaultProxy(s3.url) as proxy:
        ds = Dataset.from_jsonl("c", "s3://confirmed/a.jsonl", progress=False, cache_dir=tmp_path,
                                storage_options=s3.options(endpoint=proxy.url, confirm_every=3600))
        forget()
        proxy.reset_counts()
        assert [r["text"] for r in ds.read(0, [0, 29])] == [want[0], want[29]]
        assert proxy.methods == {"GET": 1}  # the object's one block, conditional on the ETag
        proxy.reset_counts()
        for offsets in ([5, 6], [29, 1], [12]):
            assert [r["text"] for r in ds.read(0, offsets)] == [want[i] for i in offsets]
        assert proxy.requests == 0
        fs.pipe("confirmed/a.jsonl", body.replace(b"x", b"y"))  # same size, new ETag
        assert [r["text"] for r in ds.read(0, [3])] == [want[3]]  # the listed ETag's bytes, never mixed
        strict = dataclasses.replace(ds, storage_options=s3.options(endpoint=proxy.url, confirm_every=0))
        proxy.reset_counts()
        with pytest.raises(z.DataChangedError, match="ETag"):
            strict.read(0, [3])
        assert proxy.methods["GET"] == 1
    for bad in (-1, "1", True, float("inf"), None):
        with pytest.raises(z.ConfigError, match="confirm_every"):
            dataclasses.replace(ds, storage_options={**ds.storage_options, "confirm_every": bad})


def test_a_range_cut_mid_body_is_resumed_not_fetched_again(s3):
    """A connection closed in the middle of a body costs no byte twice: the retry asks for the
    bytes not received yet, so the bodies that passed add up to the range exactly."""
    from zephon_dask.data.paths import filesystem

    fs = s3.filesystem()
    fs.mkdir("resumed")
    body = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    fs.pipe("resumed/a.bin", body)
    etag = fs.info("resumed/a.bin")["ETag"].strip('"')
    with FaultProxy(s3.url, cut=0.5, seed=3) as proxy:
        there, name = filesystem("s3://resumed/a.bin", s3.options(endpoint=proxy.url))
        with remote.pinned(name, etag):  # no size: ranges, not blocks
            got = remote.fetch_ranges(there, name, [1_000, 100_000], [90_000, 299_000])
        assert got == [body[1_000:90_000], body[100_000:299_000]]
        assert proxy.faults["cut"] > 0 and proxy.body_bytes == 299_000 - 1_000  # one span: 10 KB apart


def _read_everything(ds: Dataset) -> list:
    forget()
    return records(ds, chunk=50)


def test_node_cache_fetches_once_per_node_checks_etags_and_evicts(s3, bucket, tmp_path):
    """With storage_options' node_cache, a node fetches an object once (three processes reading it
    at once: one fetch, the others wait for it), later reads fetch nothing, a rewritten object is
    fetched again, and the least recently used objects go when the cache is over its limit."""
    import multiprocessing

    local, paths = bucket
    fs = s3.filesystem()
    fs.mkdir("cached")
    fs.put(str(local / "pq") + "/", "cached/pq/", recursive=True)
    fs.put(str(local / "hf") + "/", "cached/hf/", recursive=True)
    size = sum(fs.du("cached/pq", total=False).values())
    objects = tmp_path / "node" / "objects"
    with FaultProxy(s3.url) as proxy:
        opts = s3.options(endpoint=proxy.url, node_cache={"dir": str(tmp_path / "node"), "max_bytes": 10**9})
        ds = Dataset.from_path("pq", "s3://cached/pq", storage_options=opts, progress=False)
        want = records(Dataset.from_path("pq", str(local / "pq"), progress=False), chunk=50)
        proxy.reset_counts()
        with multiprocessing.get_context("spawn").Pool(3) as pool:
            got = pool.map(_read_everything, [ds] * 3, chunksize=1)
        assert got == [want] * 3
        assert proxy.body_bytes == size  # each object fetched once for the node, by one process
        proxy.reset_counts()
        assert _read_everything(ds) == want and proxy.body_bytes == 0
        assert sorted(p.stat().st_size for p in objects.rglob("*") if p.is_file()) == sorted(
            fs.du("cached/pq", total=False).values())

        old = fs.cat_file("cached/pq/p0.parquet")
        fs.pipe("cached/pq/p0.parquet", fs.cat_file("formats/pq/p1.parquet"))  # new ETag
        proxy.reset_counts()
        first = Dataset.from_path("p", str(local / "pq" / "p0.parquet"), progress=False).read(0, [0])
        assert ds.read(0, [0]) == first and proxy.requests == 0  # the entry is the object as indexed
        elsewhere = {**opts, "node_cache": {"dir": str(tmp_path / "other"), "max_bytes": 10**9}}
        with pytest.raises(z.DataChangedError, match="ETag"):  # a node without it: refused by the GET
            dataclasses.replace(ds, storage_options=elsewhere).read(0, [0])
        assert proxy.methods == {"GET": 1, "HEAD": 1}  # the HEAD tells a change from the same bytes again
        assert not [p for p in (tmp_path / "other").rglob("*") if p.is_file() and "objects" in p.parts]
        again = Dataset.from_path("pq", "s3://cached/pq", storage_options=opts, progress=False)
        proxy.reset_counts()
        assert again.read(0, [0]) == Dataset.from_path(
            "p", str(local / "pq" / "p1.parquet"), progress=False).read(0, [0])
        assert proxy.body_bytes == len(fs.cat_file("cached/pq/p0.parquet"))  # fetched again
        fs.pipe("cached/pq/p0.parquet", old)

        small = {**opts, "node_cache": {"dir": str(tmp_path / "node"), "max_bytes": 1}}
        hf = Dataset.from_path("hf", "s3://cached/hf", storage_options=small, progress=False)
        for i in range(hf.num_shards):
            hf.read(i, [0])
        kept = [p for p in objects.rglob("*") if p.is_file()]
        assert len(kept) == 1  # only the last object read: the rest went, least recently used first
        assert kept[0].stat().st_size == hf.shards[-1].size_bytes
    with pytest.raises(z.ConfigError, match="node_cache"):
        Dataset.from_path("x", "s3://cached/pq", storage_options={**opts, "node_cache": {"dir": "x"}},
                          progress=False)
