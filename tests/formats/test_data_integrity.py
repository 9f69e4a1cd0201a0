"""Data changed under a run is refused, and nothing is lost or ignored silently.

Real files in every format, the real ``datasets`` library writing ``save_to_disk``
folders, a real embedded Dask cluster for the error that must arrive typed in the
training process.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import tempfile
import uuid
import warnings
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.formats.test_formats_mds import own_write, samples
from zephon_dask.data import Dataset, formats, integrity
from zephon_dask.data import index as index_mod
from zephon_dask.data.shard import Shard
from zephon_dask.errors import (
    DataChangedError,
    DataFormatError,
    DatasetNotFoundError,
    ZephonError,
    ZephonWarning,
)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def docs(n: int, tag: str = "r") -> list[dict]:
    return [{"text": f"{tag}{i:04d} " + "word " * (i % 7)} for i in range(n)]


def keep_mtime(path: Path, change) -> None:
    """Apply ``change(path)`` and put the file's modification time back as it was."""
    st_ = os.stat(path)
    change(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def assert_changed(exc_info, path, *words):
    exc = exc_info.value
    assert isinstance(exc, DataChangedError) and isinstance(exc, DataFormatError)
    assert isinstance(exc, ZephonError) and isinstance(exc, ValueError)
    text = str(exc)
    assert str(path) in text and "changed since it was indexed" in text and "rebuild the Dataset" in text
    for w in words:
        assert w in text, (w, text)


# ---------------------------------------------------------------- the signature
@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 10**12))
def test_fingerprint_ranges_lie_in_the_file_and_cover_small_files(size):
    got = integrity.ranges(size)
    assert all(0 <= lo < hi <= size for lo, hi in got) or got == [(0, 0)]
    if size <= 5 * integrity.SPAN:
        assert got == [(0, size)]
    else:
        assert got[0][0] == 0 and got[-1][1] == size and len(got) == 5


def test_plain_jsonl_rewritten_with_the_same_length_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", docs(100, "r"))
    ds = Dataset.from_jsonl("a", path, progress=False)
    assert ds.read(0, [0]) == [docs(1, "r")[0]]
    write_jsonl(path, docs(100, "s"))  # same length, other records
    with pytest.raises(DataChangedError) as ei:
        ds.read(0, [0])
    assert_changed(ei, path, "dataset 'a'", "indexed (modified ", "; content differs")
    assert " bytes;" not in str(ei.value)  # no size change reported


def test_plain_jsonl_appended_to_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", docs(100))
    ds = Dataset.from_jsonl("a", path, progress=False)
    before = path.stat().st_size
    with open(path, "a") as fh:
        fh.write(json.dumps({"text": "appended"}) + "\n")
    with pytest.raises(DataChangedError) as ei:
        ds.read(0, [99])
    assert_changed(ei, path, f"size {before:,} -> {path.stat().st_size:,} bytes")
    # rebuilt, the Dataset sees the new row
    assert Dataset.from_jsonl("a", path, progress=False).num_samples == 101


def write_format(fmt: str, folder: Path) -> Path:
    """One small file (or MDS folder) of ``fmt`` holding the same 60 documents."""
    rows = docs(60)
    if fmt == "jsonl":
        return write_jsonl(folder / "a.jsonl", rows)
    if fmt == "jsonl.gz":
        path = folder / "a.jsonl.gz"
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0))
        return path
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, folder / "a.parquet")
        return folder / "a.parquet"
    if fmt == "arrow":
        with pa.OSFile(str(folder / "a.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return folder / "a.arrow"
    assert fmt == "mds"
    own_write(folder / "mds", samples(30), per_shard=30, compression=None)
    return folder / "mds"


def data_file(path: Path) -> Path:
    return path if path.is_file() else next(p for p in path.iterdir() if p.suffix == ".mds")


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "arrow", "mds"])
def test_same_size_change_with_its_mtime_restored_is_refused_in_every_format(tmp_path, fmt):
    # the hardest case: only the content fingerprint can tell
    path = write_format(fmt, tmp_path)
    ds = Dataset.from_path("d", path, progress=False)
    assert len(ds.read(0, [0, 1])) == 2
    target = data_file(path)
    keep_mtime(target, flip_middle_byte)
    with pytest.raises(DataChangedError) as ei:
        ds.read(0, [0])
    assert_changed(ei, target.name, "indexed (content differs in the sampled byte ranges);")


# ------------------------------------------------------------ identity by content
def new_mtime(path: Path) -> None:
    """Move the file's modification time a second on, its bytes untouched (``touch``)."""
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))


def same_bytes_new_file(path: Path) -> None:
    """Put a byte-identical copy in the file's place (a new file, a new mtime), as ``cp`` to a
    temporary name and a rename, or a download again, does."""
    copy = path.with_name(path.name + ".copy")
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(0, os.stat(path).st_mtime_ns + 2 * 10**9))
    os.replace(copy, path)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "arrow", "mds"])
@pytest.mark.parametrize("change", [new_mtime, same_bytes_new_file], ids=["touch", "copy"])
def test_a_file_touched_or_copied_byte_for_byte_reads_on_in_every_format(tmp_path, fmt, change):
    path = write_format(fmt, tmp_path)
    ds = Dataset.from_path("d", path, progress=False)
    before = repr(ds.read(0, [0, 7, 29]))  # MDS records hold arrays: compared by their repr
    change(data_file(path))
    assert repr(ds.read(0, [0, 7, 29])) == before
    assert ds.shards[0].digest == "sha256:" + hashlib.sha256(data_file(path).read_bytes()).hexdigest()


def test_the_whole_file_is_hashed_once_per_process_for_a_new_mtime(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "a.jsonl", docs(100))
    ds = Dataset.from_jsonl("a", path, progress=False)
    hashed = []
    real = integrity.digest
    monkeypatch.setattr(integrity, "digest", lambda fh, *a: hashed.append(1) or real(fh, *a))
    for change in (new_mtime, same_bytes_new_file):
        change(path)
        for i in range(5):
            assert ds.read(0, [i]) == [docs(100)[i]]
    assert len(hashed) == 2  # once per new mtime, not per read


def test_a_same_size_change_the_samples_miss_is_refused_when_the_mtime_moved(tmp_path):
    # one byte between the five sampled ranges: only the whole-file digest tells
    path = write_jsonl(tmp_path / "a.jsonl", docs(2000))
    ds = Dataset.from_jsonl("a", path, progress=False)
    data = bytearray(path.read_bytes())
    (lo, hi), (lo2, _) = integrity.ranges(len(data))[:2]
    at = data.index(b'"r', (hi + lo2) // 2) + 1  # a record's first letter, far from the samples
    data[at:at + 1] = b"s"
    path.write_bytes(bytes(data))  # same size, a new mtime, the sampled ranges unchanged
    assert integrity.local(str(path)).fingerprint == ds.shards[0].fingerprint
    with pytest.raises(DataChangedError) as ei:
        ds.read(0, [0])
    assert_changed(ei, path, "modified ", "content differs (the digest of the whole file)")
    new_mtime(path)  # refused again at the next mtime: a verdict is kept for its own mtime only
    with pytest.raises(DataChangedError, match="digest of the whole file"):
        ds.read(0, [0])


@settings(max_examples=30, deadline=None)
@given(data=st.binary(min_size=0, max_size=30_000), at=st.floats(0, 1), flip=st.integers(0, 255),
       touch=st.booleans())
def test_a_file_with_its_mtime_moved_is_refused_exactly_when_its_bytes_differ(data, at, flip, touch):
    # the oracle: the bytes compared whole; the shard as an index records it
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.bin"
        path.write_bytes(data)
        sig = integrity.local(str(path))
        shard = Shard("a.bin", str(path), 1, sig.size, None, sig.mtime_ns, None, sig.fingerprint,
                      digest=integrity.local_digest(str(path), sig))
        now = bytearray(data)
        if now:
            now[min(int(at * len(now)), len(now) - 1)] ^= flip
        path.write_bytes(bytes(now))
        moved = touch or bytes(now) != data  # a write moves the mtime; the same bytes may keep it
        os.utime(path, ns=(0, sig.mtime_ns + moved * 10**9))
        if bytes(now) == data:
            integrity.verify(shard, None)
        else:
            with pytest.raises(DataChangedError):
                integrity.verify(shard, None)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 10**6), mtime=st.integers(0, 2**62), moved=st.booleans(),
       tag=st.sampled_from([None, "a", "b"]), tag_now=st.sampled_from([None, "a", "b"]))
def test_an_unmoved_etag_vouches_for_the_content_whatever_the_mtime(size, mtime, moved, tag, tag_now):
    was = integrity.Signature(size, mtime, tag)
    now = integrity.Signature(size, mtime + moved, tag_now)
    assert integrity.unchanged_tag(was, now) == (tag is not None and tag == tag_now)
    assert not integrity.unchanged_tag(was, integrity.Signature(size + 1, mtime, tag))
    assert integrity.only_stamps_moved(was, now)


def test_a_file_on_an_fsspec_filesystem_is_checked_by_what_the_filesystem_reports():
    fs = fsspec.filesystem("memory")
    root = f"/zephon-test-{uuid.uuid4().hex}"
    fs.pipe(f"{root}/a.jsonl", b'{"text": "aa"}\n{"text": "bb"}\n')
    ds = Dataset.from_jsonl("m", f"memory://{root}", progress=False)
    assert ds.shards[0].fingerprint is None and ds.shards[0].mtime_ns is not None
    assert ds.read(0, [1]) == [{"text": "bb"}]
    fs.pipe(f"{root}/a.jsonl", b'{"text": "cc"}\n{"text": "dd"}\n')  # same size
    with pytest.raises(DataChangedError) as ei:
        ds.read(0, [1])
    assert_changed(ei, f"memory://{root}/a.jsonl", "modified")


def test_a_deleted_file_is_named(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", docs(5))
    ds = Dataset.from_jsonl("a", path, progress=False)
    path.unlink()
    with pytest.raises(DatasetNotFoundError, match="no longer exists") as ei:
        ds.read(0, [0])
    assert str(path) in str(ei.value) and "dataset 'a'" in str(ei.value)


# ----------------------------------------------------------------- the index cache
def cache_file(directory: Path) -> str:
    return index_mod.index_file(os.path.abspath(directory), index_mod.cache_dir())


def test_an_index_cache_edited_by_hand_is_rebuilt_never_trusted(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", docs(3000))
    assert Dataset.from_jsonl("a", path, progress=False).num_samples == 3000
    target = cache_file(tmp_path)
    doc = json.loads(Path(target).read_text())
    doc["files"]["a.jsonl"]["num_samples"] = 42
    Path(target).write_text(json.dumps(doc))
    with pytest.warns(ZephonWarning, match="checksum") as seen:
        ds = Dataset.from_jsonl("a", path, progress=False)
    assert ds.num_samples == 3000 and len(seen) == 1 and target in str(seen[0].message)
    assert json.loads(Path(target).read_text())["files"]["a.jsonl"]["num_samples"] == 3000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten cache is trusted again
        assert Dataset.from_jsonl("a", path, progress=False).num_samples == 3000


def test_a_cached_entry_whose_file_changed_behind_size_and_mtime_is_indexed_again(tmp_path, monkeypatch):
    # the fingerprint is taken afresh on every build, so the cache never outlives the content
    path = write_jsonl(tmp_path / "a.jsonl", docs(40))
    Dataset.from_jsonl("a", path, progress=False)
    keep_mtime(path, lambda p: write_jsonl(p, docs(40, "s")))  # same size, same mtime
    calls = []
    reader = formats.READERS["jsonl"]
    monkeypatch.setitem(formats.READERS, "jsonl", dataclasses.replace(
        reader, inspect=lambda fs, f: calls.append(f.rel) or reader.inspect(fs, f)))
    ds = Dataset.from_jsonl("a", path, progress=False)
    assert calls == ["a.jsonl"] and ds.read(0, [0]) == [docs(1, "s")[0]]


@pytest.mark.slow
@pytest.mark.parametrize("change", ["append", "same length"])
def test_a_file_changed_under_a_run_on_the_default_runner_arrives_typed(tmp_path, change):
    folder = tmp_path / "web"
    folder.mkdir()
    for k in range(2):
        write_jsonl(folder / f"part-{k}.jsonl", docs(60, f"p{k}-"))
    ds = Dataset.from_jsonl("web", folder, progress=False)
    if change == "append":  # after the Dataset was built
        with open(folder / "part-1.jsonl", "a") as fh:
            fh.write(json.dumps({"text": "late"}) + "\n")
    else:  # other records, same size: a worker's own scan of the file finds nothing amiss
        write_jsonl(folder / "part-1.jsonl", docs(60, "q1-"))
    ws = z.MixtureWorkSource([ds], chunk_size=8, seed=0)
    # the default runner; every window on the cluster's worker (no head start in this process)
    p = z.Pipeline(ws).tokenize("bytes").pack(64).batch(2).options(
        canonical_replicas=2, n_workers=1, head_start=False)
    with p, pytest.raises(DataChangedError) as ei:
        list(p)
    assert_changed(ei, folder / "part-1.jsonl", "dataset 'web'",
                   "size " if change == "append" else "content differs")


# -------------------------------------------------------- save_to_disk folders
def hf_rows(n: int, start: int = 0) -> dict[str, list]:
    return {"text": [f"doc {i} " + "x" * (i % 5) for i in range(start, start + n)],
            "id": list(range(start, start + n))}


def everything(ds: Dataset) -> list[dict]:
    return [r for i, n in enumerate(ds.shard_sizes) for r in ds.read(i, list(range(n)))]


@pytest.fixture
def hf():
    datasets = pytest.importorskip("datasets")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return datasets


def test_save_to_disk_files_are_read_in_state_json_order(tmp_path, hf):
    folder = tmp_path / "one"
    hf.Dataset.from_dict(hf_rows(120)).save_to_disk(str(folder), num_shards=4)
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = state["_data_files"][::-1]  # an order that is not the names' order
    (folder / "state.json").write_text(json.dumps(state))
    theirs = hf.load_from_disk(str(folder))
    for ours in (Dataset.from_hf("one", folder, progress=False),
                 Dataset.from_path("one", folder, progress=False)):
        assert [s.shard_id for s in ours.shards] == [f["filename"] for f in state["_data_files"]]
        assert everything(ours) == [theirs[i] for i in range(len(theirs))]


def test_a_save_to_disk_folder_missing_an_arrow_file_is_refused(tmp_path, hf):
    one = tmp_path / "one"
    hf.Dataset.from_dict(hf_rows(120)).save_to_disk(str(one), num_shards=3)
    gone = one / "data-00001-of-00003.arrow"
    gone.unlink()
    with pytest.raises(FileNotFoundError):  # what datasets itself does
        hf.load_from_disk(str(one))
    for build in (lambda: Dataset.from_hf("one", one, progress=False),
                  lambda: Dataset.from_path("one", one, progress=False),
                  lambda: Dataset.from_arrow("one", one, progress=False)):
        with pytest.raises(DataFormatError) as ei:
            build()
        assert gone.name in str(ei.value) and "state.json" in str(ei.value), str(ei.value)
        assert "incomplete" in str(ei.value)

    dd = tmp_path / "dd"
    hf.DatasetDict({"train": hf.Dataset.from_dict(hf_rows(90)),
                    "test": hf.Dataset.from_dict(hf_rows(9, 500))}).save_to_disk(str(dd), num_shards={"train": 3, "test": 1})
    (dd / "train" / "data-00002-of-00003.arrow").unlink()
    with pytest.raises(DataFormatError, match="data-00002-of-00003.arrow"):
        Dataset.from_hf("t", dd, split="train", progress=False)
    assert Dataset.from_hf("t", dd, split="test", progress=False).num_samples == 9


def test_a_save_to_disk_folder_without_state_json_says_so(tmp_path, hf):
    one = tmp_path / "one"
    hf.Dataset.from_dict(hf_rows(40)).save_to_disk(str(one), num_shards=2)
    (one / "state.json").unlink()
    for build in (lambda: Dataset.from_hf("one", one, progress=False),
                  lambda: Dataset.from_path("one", one, progress=False)):
        with pytest.raises(DataFormatError) as ei:
            build()
        text = str(ei.value)
        assert "no state.json" in text and "mixes formats" not in text and "data_files='*.arrow'" in text
    # the fix the message gives works
    assert Dataset.from_hf("one", one, data_files="*.arrow", progress=False).num_samples == 40
    dd = tmp_path / "dd"
    hf.DatasetDict({"train": hf.Dataset.from_dict(hf_rows(30))}).save_to_disk(str(dd))
    (dd / "train" / "state.json").unlink()
    with pytest.raises(DataFormatError, match="has no state.json"):
        Dataset.from_hf("t", dd, split="train", progress=False)


def test_a_split_a_saved_dataset_does_not_have_is_refused(tmp_path, hf):
    one = tmp_path / "one"
    hf.Dataset.from_dict(hf_rows(20)).save_to_disk(str(one))
    with pytest.raises(z.ConfigError) as ei:
        Dataset.from_hf("v", one, split="validation", progress=False)
    assert "'validation'" in str(ei.value) and "no splits" in str(ei.value)
    with pytest.raises(z.ConfigError, match="validation"):
        Dataset.from_path("v", one, split="validation", progress=False)
    named = tmp_path / "named"
    hf.Dataset.from_dict(hf_rows(20), split=hf.Split.TRAIN).save_to_disk(str(named))
    assert Dataset.from_hf("t", named, split="train", progress=False).num_samples == 20
    with pytest.raises(z.ConfigError, match="its only split is 'train'"):
        Dataset.from_hf("t", named, split="test", progress=False)


# -------------------------------------------------------------- reader errors
def mds_with_encoding(folder: Path, encoding: str) -> Path:
    own_write(folder, samples(6), per_shard=6, compression=None)
    index = json.loads((folder / "index.json").read_text())
    for shard in index["shards"]:
        shard["column_encodings"][shard["column_names"].index("tokens")] = encoding
    (folder / "index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("encoding, words", [
    ("ndarray:uint32:abc", ["shape 'abc'", "comma-separated"]),
    ("ndarray:complex64", ["dtype 'complex64'", "supported", "uint32"]),
    ("ndarray:not_a_dtype", ["dtype 'not_a_dtype'"]),
    ("ndarray:uint32:2:3", ["ndarray[:dtype[:shape]]"]),
])
def test_mds_column_encodings_mds_does_not_write_are_refused_at_open(tmp_path, encoding, words):
    folder = mds_with_encoding(tmp_path / "m", encoding)
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_mds("m", folder)
    text = str(ei.value)
    assert str(folder) in text and "column 'tokens'" in text and repr(encoding) in text, text
    for w in words:
        assert w in text, (w, text)
    ok = Dataset.from_mds("ok", mds_with_encoding(tmp_path / "ok", "ndarray:uint32"))
    assert ok.read(0, [0])[0]["tokens"].dtype.name == "uint32"


def test_a_tokenizer_config_that_is_not_json_is_named(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.unit.test_chat import SPECIALS

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}",')  # cut short
    ds = Dataset.from_records("c", [{"messages": [{"role": "user", "content": "hi"}]}], text_field="messages")
    pipe = z.Pipeline(z.MixtureWorkSource([ds], chunk_size=1))
    with pytest.raises(z.ConfigError) as ei:
        pipe.tokenize_chat(tmp_path)
    text = str(ei.value)
    assert "tokenizer_config.json" in text and "not valid JSON" in text and "chat_template=" in text
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(z.ConfigError, match="not an object"):
        pipe.tokenize_chat(tmp_path)


def test_a_lone_surrogate_in_records_names_the_record():
    with pytest.raises(DataFormatError) as ei:
        Dataset.from_records("r", {"a": [{"text": "ok"}], "b": [{"text": "ok"}, {"text": "bad \ud800 x"}]})
    text = str(ei.value)
    assert "shard 'b', record 1" in text and "lone surrogate" in text and "'\\ud800'" in text


# ------------------------------------------ a stream that loses data silently
def one_pass(datasets, weights=None, **options):
    ws = z.MixtureWorkSource(datasets, weights, chunk_size=8, seed=0)
    return z.Pipeline(ws), {"runner": "synchronous", "canonical_replicas": 2, **options}


def test_a_filter_dropping_everything_on_a_one_pass_stream_raises_a_typed_error():
    ds = Dataset.from_records("d", [{"text": f"doc {i} " * 4} for i in range(64)])
    base, opts = one_pass([ds])
    p = base.filter(lambda r: False).tokenize("bytes").pack(16).batch(1).options(**opts)
    with p, pytest.raises(z.EmptyDatasetError) as ei:
        next(iter(p))  # not a bare StopIteration at step 0
    assert isinstance(ei.value, ZephonError) and isinstance(ei.value, ValueError)
    assert type(ei.value).__name__ == "EmptyStreamError"
    text = str(ei.value)
    assert "gave no sample although 64 records were read" in text and "'filter.dropped': 64" in text
    # a stream resumed at its end goes on into the next pass, as the uninterrupted one does: no error
    good = base.tokenize("bytes").pack(16).batch(1).options(**opts)
    with good:
        n = len(list(good))
        state = good.state_dict()
    again = base.tokenize("bytes").pack(16).batch(1).options(**opts).load_state_dict(state)
    with again:
        assert n > 0 and len(list(again)) == n


def test_a_dataset_a_filter_removes_from_a_mixture_is_named_once(recwarn):
    a = Dataset.from_records("a", [{"text": f"a {i} " * 4} for i in range(200)])
    b = Dataset.from_records("b", [{"text": f"b {i} " * 4} for i in range(200)])
    base, opts = one_pass([a, b], {"a": 1, "b": 1})
    opts = {**opts, "drop_last_step": False}  # every sample: no batch dropped at the pass's end to warn of
    p = base.filter(lambda r: r["text"][0] != "b").tokenize("bytes").pack(16).batch(1).options(**opts)
    with p:
        rows = list(p)
    mine = [w for w in recwarn if issubclass(w.category, ZephonWarning)]
    assert rows and len(mine) == 1, [str(w.message) for w in mine]
    text = str(mine[0].message)
    assert "dataset 'b' contributes nothing to the first window" in text and "'filter.dropped'" in text
    recwarn.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZephonWarning)  # a filter keeping some of each: no warning
        q = base.filter(lambda r: int(r["text"].split()[1]) % 2 == 0).tokenize("bytes").pack(16).batch(1)
        with q.options(**opts) as q:
            assert list(q)


def test_a_chat_template_that_never_renders_assistant_turns_is_refused_at_the_first_window():
    from tests.unit.test_chat import CHATML

    silent = ("{% for m in messages %}{% if m['role'] != 'assistant' %}<|im_start|>{{ m['role'] }}\n"
              "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}")
    convs = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]}
             for i in range(40)]
    ds = Dataset.from_records("c", convs, text_field="messages")
    base, opts = one_pass([ds], canonical_replicas=1)
    p = base.tokenize_chat("bytes", chat_template=silent).pack(32).batch(1).options(**opts)
    with p, pytest.raises(z.ChatFormatError) as ei:
        next(iter(p))
    text = str(ei.value)
    assert "not one trained token" in text and "lane 0, window 0" in text and "sha256 " in text
    assert "{% for m in messages %}" in text  # the template is named
    good = base.tokenize_chat("bytes", chat_template=CHATML).pack(32).batch(1).options(**opts)
    with good:
        assert next(iter(good))["tokens"].shape == (1, 32)
