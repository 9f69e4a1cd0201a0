"""The pure window function, the stateless operators, shuffle, batches and the fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.oracles import ref_block_shuffle, ref_identity_key
from zephon_dask.consumer import BatchOptions, LaneBatcher, make_batch
from zephon_dask.core import compute_chunk, compute_window
from zephon_dask.errors import ConfigError, DatasetNotFoundError, MissingFieldError, ZephonError
from zephon_dask.operators.base import WindowContext
from zephon_dask.operators.shuffle import Shuffle
from zephon_dask.operators.table import SampleTable

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def corpus(n_shards=3, per_shard=40, seed=0, prefix="doc"):
    rng = np.random.default_rng(seed)
    return {
        f"s{s}": [
            {"text": f"{prefix} {s}-{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 60))))}
            for i in range(per_shard)
        ]
        for s in range(n_shards)
    }


def make_pipeline(seed=3, chunk_size=16, R=4, k=2, algorithm="wrap", shuffle=True, pack=True):
    web = z.Dataset.from_records("web", corpus(3, 40, 1, "web"))
    code = z.Dataset.from_records("code", corpus(2, 30, 2, "code"))
    ws = z.MixtureWorkSource([web, code], {"web": 2, "code": 1}, chunk_size=chunk_size, seed=seed)
    p = z.Pipeline(ws).tokenize("bytes", bos=True, eos=True)
    if shuffle:
        p = p.shuffle(8)
    if pack:
        p = p.pack(64, algorithm=algorithm)
    return p.options(canonical_replicas=R, flush_every_k_chunks=k)


def test_window_equals_its_chunks_and_lineage_stays_inside():
    p = make_pipeline()
    spec = p.spec
    ws = spec.source
    for lane in range(4):
        for w in range(spec.num_windows(lane)):
            out = compute_window(spec, lane, w)
            chunks = spec.window_chunks(lane, w)
            assert out.chunks == tuple(chunks)
            allowed = {tuple(ptr) for g in chunks for ptr in np.stack(ws.chunk_arrays(g), 1).tolist()}
            used = {tuple(r) for r in out.table.lineage[:, :3].tolist()}
            assert used <= allowed  # no record crosses a window boundary
            assert out.stats["pack.slots"] == len(out) * 64
            assert 0 < out.efficiency <= 1


def test_window_is_pure_and_order_independent():
    p = make_pipeline()
    spec = p.spec
    alone = compute_window(spec, 1, 1).digest()
    compute_window(spec, 0, 0), compute_window(spec, 2, 1)
    assert compute_window(spec, 1, 1).digest() == alone
    # a fresh spec object (as in another task) gives the same bytes
    assert compute_window(make_pipeline().spec, 1, 1).digest() == alone


def test_tokens_are_conserved_by_wrap_except_reported_leftover():
    p = make_pipeline(shuffle=False)
    spec = p.spec
    for lane in range(4):
        out = compute_window(spec, lane, 0)
        docs = sum(int(compute_chunk(spec, g).table.tokens.size) for g in out.chunks)
        assert out.stats["pack.tokens"] + out.stats.get("pack.dropped_tokens", 0) == docs


def _digests():
    spec = make_pipeline().spec
    return {(lane, w): compute_window(spec, lane, w).digest() for lane in range(4) for w in range(2)}


@pytest.mark.slow  # a fresh interpreter
def test_same_bytes_in_another_process_with_other_hash_seed():
    code = (
        "import tests.unit.test_window as t\n"
        "print(repr(sorted(t._digests().items())))"
    )
    outs = []
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        outs.append(res.stdout)
    assert outs[0] == outs[1] == repr(sorted(_digests().items())) + "\n"


def test_golden_window_hashes():
    """Pins the bytes of make_pipeline()'s windows: a change here changes users' data."""
    got = _digests()
    assert {k: v[:16] for k, v in got.items()} == GOLDEN_PREFIXES


GOLDEN_PREFIXES: dict = {
    (0, 0): '2d64ae96a71f6141',
    (0, 1): '8403c79a9b9b9338',
    (1, 0): 'a7a55ce63d7cfe3a',
    (1, 1): '082c731d6f18b133',
    (2, 0): '39567a924a997701',
    (2, 1): 'e4d874795883dbc5',
    (3, 0): '672196297412a367',
    (3, 1): 'fae6e13f972ccaa9',
}


def test_fingerprint_tracks_data_settings_only():
    base = make_pipeline().fingerprint()
    assert make_pipeline().fingerprint() == base
    exec_only = make_pipeline().options(runner="threads", prefetch_windows=1, n_workers=2, fuse=True,
                                        retries=5, dp_degree=2, dp_group_id=1, mapping_strategy="interleaved")
    assert exec_only.fingerprint() == base
    changed = [
        make_pipeline(seed=4), make_pipeline(chunk_size=17), make_pipeline(R=8), make_pipeline(k=3),
        make_pipeline(algorithm="first_fit"), make_pipeline(shuffle=False),
    ]
    prints = [p.fingerprint() for p in changed]
    assert base not in prints and len(set(prints)) == len(prints)

    def pipe(**tok):
        ws = z.MixtureWorkSource([z.Dataset.from_records("a", ["x y", "z"])], chunk_size=1)
        return z.Pipeline(ws).tokenize(**tok).fingerprint()

    assert pipe() != pipe(eos=False) != pipe(max_length=4)
    assert pipe(tokenizer=lambda s: [1], eos=False) != pipe(tokenizer=lambda s: [2], eos=False)
    assert pipe(tokenizer=lambda s: [1], eos=False, version=1) == pipe(tokenizer=lambda s: [2], eos=False, version=1)


def _bpe_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer)
    tok.save(str(path))
    return tok


def test_hf_tokenizer_from_file_and_object(tmp_path):
    tok = _bpe_tokenizer(tmp_path / "tokenizer.json")
    ds = z.Dataset.from_records("a", [{"text": "the quick brown fox"}, {"text": "lazy dog"}])
    ws = z.MixtureWorkSource([ds], chunk_size=2, seed=0, shuffle_within_shard=False)
    from_file = z.Pipeline(ws).tokenize(str(tmp_path / "tokenizer.json"), bos=True)
    from_obj = z.Pipeline(ws).tokenize(tok, bos=True)
    assert from_file.fingerprint() == from_obj.fingerprint()
    out = compute_chunk(from_file.spec, 0).table
    first = out.tokens[out.offsets[0]:out.offsets[1]].tolist()
    expected = tok.encode("the quick brown fox", add_special_tokens=False).ids
    assert first == [tok.token_to_id("<s>"), *expected, tok.token_to_id("</s>")]


def test_truncation_is_counted_and_split_keeps_every_token():
    ds = z.Dataset.from_records("a", [{"text": "a" * 25}, {"text": "b" * 3}])
    ws = z.MixtureWorkSource([ds], chunk_size=2, seed=0, shuffle_within_shard=False)
    cut = compute_chunk(z.Pipeline(ws).tokenize(max_length=10).spec, 0)
    assert cut.table.lengths.tolist() == [10, 4]
    assert cut.stats["tokenize.truncated_tokens"] == 16
    split = compute_chunk(z.Pipeline(ws).tokenize(max_length=10, split_long=True).spec, 0).table
    assert split.lengths.tolist() == [10, 10, 6, 4]
    assert split.lineage[:, 3].tolist() == [0, 10, 20, 0]  # token_start of each piece
    assert split.lineage[:, 2].tolist() == [0, 0, 0, 1]


def test_map_filter_and_decode_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [b"keep me", b"drop", "caf\u00e9".encode()]
    pq.write_table(pa.table({"text": pa.array(raw, pa.binary())}), tmp_path / "bytes.parquet")
    ds = z.Dataset.from_parquet("a", str(tmp_path / "bytes.parquet"))
    ws = z.MixtureWorkSource([ds], chunk_size=3, shuffle_within_shard=False)
    p = (z.Pipeline(ws).decode_text().filter(lambda r: r["text"] != "drop")
         .map(lambda r: {**r, "text": r["text"].upper()}).tokenize(eos=False))
    out = compute_chunk(p.spec, 0)
    texts = [bytes(out.table.tokens[a:b].astype(np.uint8)).decode() for a, b in
             zip(out.table.offsets[:-1], out.table.offsets[1:])]
    assert texts == ["KEEP ME", "CAF\u00c9"]
    assert out.stats["filter.dropped"] == 1


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 12), min_size=0, max_size=60), st.integers(1, 20), st.integers(0, 99))
def test_shuffle_is_a_permutation_keyed_by_identity(lengths, buffer, seed):
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    n = len(lengths)
    lineage = np.array([[i % 3, i % 5, i, 0, n_] for i, n_ in enumerate(lengths)], dtype=np.int64)
    table = SampleTable.from_documents(np.arange(offsets[-1]) % 251, offsets, lineage.reshape(n, 5))
    ctx = WindowContext(seed, 0, 0, ("a", "b", "c"))
    out = Shuffle(buffer).apply(table, ctx)
    assert sorted(out.lineage[:, 2].tolist()) == list(range(n))
    assert Counter(out.tokens.tolist()) == Counter(table.tokens.tolist())
    assert out.digest() == Shuffle(buffer).apply(table, ctx).digest()
    # another window with the same records shuffles them the same way: no running counter
    assert out.digest() == Shuffle(buffer).apply(table, WindowContext(seed, 3, 9, ())).digest()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 9), min_size=0, max_size=70), st.integers(1, 40), st.integers(0, 99),
       st.sampled_from(["block", "block_warmup"]))
def test_block_shuffles_match_the_slow_reference(lengths, buffer, seed, algorithm):
    n = len(lengths)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    lineage = np.array([[i % 2, i % 7, 3 * i, i % 4, n_] for i, n_ in enumerate(lengths)], dtype=np.int64)
    table = SampleTable.from_documents(np.arange(offsets[-1]) % 251, offsets, lineage.reshape(n, 5))
    out = Shuffle(buffer, algorithm=algorithm).apply(table, WindowContext(seed, 1, 2, ("a", "b")))
    keys = [ref_identity_key(seed, row) for row in lineage]
    order = ref_block_shuffle(keys, buffer, warmup=algorithm == "block_warmup")
    assert out.digest() == (table.take(order) if n > 1 else table).digest()
    if algorithm == "block":  # no sample leaves its block of buffer_size
        assert all(a // buffer == b // buffer for a, b in zip(order, range(n)))


def test_block_warmup_blocks_grow_to_the_buffer_and_the_algorithm_enters_the_fingerprint():
    from zephon_dask.operators.shuffle import warmup_sizes

    assert warmup_sizes(100, 32) == [2, 4, 8, 16, 32, 32, 6]
    assert warmup_sizes(3, 8) == [1, 2]
    assert Shuffle(8).spec() == {"op": "shuffle", "buffer_size": 8, "seed": None}  # as before the choice
    web = z.Dataset.from_records("web", corpus(2, 20, 1, "web"))
    base = z.Pipeline(z.MixtureWorkSource([web], chunk_size=8, seed=1)).tokenize()
    specs = {base.shuffle(8, algorithm=a).spec.fingerprint for a in ("reservoir", "block", "block_warmup")}
    assert len(specs) == 3
    with pytest.raises(ConfigError, match=r"algorithm='blok'.*block"):
        base.shuffle(8, algorithm="blok")


def _take_by_tokens(table: SampleTable, index) -> SampleTable:
    """Oracle of ``SampleTable.take``: each sample's slices, one by one."""
    parts = [table.slice(i, i + 1) for i in index]
    picked = SampleTable.concat(parts) if parts else SampleTable.empty()
    return picked if parts else SampleTable(
        table.tokens[:0], np.zeros(1, np.int64), table.positions[:0], table.document_ids[:0],
        table.lineage[:0], np.zeros(1, np.int64), None if table.loss_mask is None else table.loss_mask[:0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=9), st.integers(0, 4), st.booleans(), st.data())
def test_take_gathers_whole_rows_of_packed_tables_as_any_table(rows_lineage, width, masked, data):
    """Rows of one length (packed, as a shuffle after a pack sees them) take the row path; it
    gives the bytes the per-sample oracle gives, as does a table whose rows differ in length."""
    n = len(rows_lineage)
    offsets = np.arange(n + 1, dtype=np.int64) * width
    tokens = (np.arange(n * width) % 97).astype(np.int32)
    loffsets = np.concatenate(([0], np.cumsum(rows_lineage))).astype(np.int64)
    lineage = np.arange(int(loffsets[-1]) * 5, dtype=np.int64).reshape(-1, 5)
    mask = (tokens % 2).astype(np.uint8) if masked else None
    table = SampleTable(tokens, offsets, tokens + 1, tokens % 3, lineage, loffsets, mask)
    index = data.draw(st.lists(st.integers(0, n - 1), max_size=12)) if n else []
    assert table.take(index).digest() == _take_by_tokens(table, index).digest()
    if n > 1 and width:  # one row shorter: the generic path
        ragged = table.slice(0, n)
        ragged = SampleTable(ragged.tokens[:-1], np.minimum(offsets, n * width - 1), ragged.positions[:-1],
                             ragged.document_ids[:-1], lineage, loffsets, None if mask is None else mask[:-1])
        assert ragged.take(index).digest() == _take_by_tokens(ragged, index).digest()


def test_stateful_accumulator_state_never_leaks_between_windows():
    calls = []

    def init():
        calls.append("init")
        return {"seen": 0}

    def push(state, sample):
        state["seen"] += 1
        return [sample] if state["seen"] % 2 else []

    def flush(state):
        return []

    p = make_pipeline(shuffle=False, pack=False)
    p = p.stateful("odd", init, push, flush, version=1)
    spec = p.spec
    a = compute_window(spec, 0, 1).digest()
    compute_window(spec, 0, 0)
    assert compute_window(spec, 0, 1).digest() == a
    assert calls.count("init") == 3


def test_batches_cut_per_lane_across_windows_with_drop_last_at_lane_end():
    spec = make_pipeline().spec
    tables = [compute_window(spec, 2, w).table for w in range(spec.num_windows(2))]
    total = sum(len(t) for t in tables)
    for drop_last in (True, False):
        opts = BatchOptions(microbatch_size=3, drop_last=drop_last)
        lb = LaneBatcher(2, opts, spec.source.names)
        batches = []
        for w, t in enumerate(tables):
            lb.push(w, t)
            while lb.ready():
                batches.append(lb.pop())
        last = lb.finish()
        batches += [last] if last is not None else []
        assert [b.index_in_lane for b in batches] == list(range(len(batches)))
        assert [b.last for b in batches] == [False] * (len(batches) - 1) + [not drop_last]
        starts = np.cumsum([0] + [len(t) for t in tables])
        delivered = np.cumsum([b.num_samples for b in batches])
        for b, n in zip(batches, delivered, strict=True):  # the frontier after each batch
            w, o = b.position
            assert starts[w] + o == n and (o < len(tables[w]) if w < len(tables) else o == 0)
        got = np.concatenate([b["tokens"] for b in batches])
        want = SampleTable.concat(tables).tokens.reshape(-1, 64)
        assert (got == want[: len(got)]).all()
        assert len(got) == (total // 3 * 3 if drop_last else total)


def test_batch_fields():
    lineage = np.array([[0, 0, 0, 0, 3], [0, 0, 1, 0, 2], [0, 0, 2, 0, 4]])
    table = SampleTable.from_documents(np.array([5, 6, 7, 8, 9, 1, 2, 3, 4]), [0, 3, 5, 9], lineage)
    opts = BatchOptions(3, labels=True, ignore_index=-1, cu_seqlens=True)
    b = make_batch(table, lane=1, index_in_lane=7, opts=opts, dataset_names=("d",))
    assert (b.lane, b.index_in_lane) == (1, 7)
    assert b["tokens"].tolist() == [[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]]
    assert b["lengths"].tolist() == [3, 2, 4]
    assert b["labels"].tolist() == [[6, 7, -1, -1], [9, -1, -1, -1], [2, 3, 4, -1]]
    assert b["loss_mask"].sum() == 6
    assert b["cu_seqlens"].tolist() == [0, 3, 4, 6, 8, 12]
    assert b.sources(2) == [("d", 0, 2, 0, 4)]
    t = b.to_torch()
    import torch

    assert t["tokens"].dtype == torch.int64 and t["tokens"].shape == (3, 4)


def test_labels_masked_across_document_boundaries():
    spec = make_pipeline(shuffle=False).spec
    out = compute_window(spec, 0, 0)
    keep = make_batch(out.table.slice(0, 2), 0, 0, BatchOptions(2, labels=True))
    mask = make_batch(out.table.slice(0, 2), 0, 0, BatchOptions(2, labels=True, mask_document_boundaries=True))
    ids = keep["document_ids"]
    crossing = np.zeros_like(ids, dtype=bool)
    crossing[:, :-1] = (ids[:, 1:] != ids[:, :-1]) & (ids[:, 1:] >= 0)
    assert (keep["labels"][crossing] != -100).all()
    assert (mask["labels"][crossing] == -100).all()
    assert (keep["labels"][~crossing] == mask["labels"][~crossing]).all()


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda p: p.tokenize().pack(64, algorithm="greedy"), ConfigError, "greedy"),
        (lambda p: p.tokenize().pack(0), ConfigError, "max_length"),
        (lambda p: p.tokenize("/no/such/tokenizer.json"), DatasetNotFoundError, "/no/such/tokenizer.json"),
        (lambda p: p.pack(64), ConfigError, "tokenize"),
        (lambda p: p.tokenize().shuffle(8).map(lambda r: r), ConfigError, "move it earlier"),
        (lambda p: p.tokenize().tokenize(), ConfigError, "once"),
        (lambda p: p.tokenize(split_long=True), ConfigError, "max_length"),
        (lambda p: p.tokenize().shuffle(0), ConfigError, "buffer_size"),
        (lambda p: p.tokenize().batch(0), ConfigError, "microbatch_size"),
        (lambda p: p.batch(2), ConfigError, "tokenize"),
        (lambda p: p.options(prefetch=3), ConfigError, "unknown option"),
        (lambda p: p.options(canonical_replicas=0), ConfigError, "canonical_replicas"),
    ],
)
def test_bad_pipelines_fail_at_build_time(build, error, match):
    ws = z.MixtureWorkSource([z.Dataset.from_records("a", ["x", "y"])], chunk_size=1)
    with pytest.raises(error, match=match) as info:
        build(z.Pipeline(ws))
    assert isinstance(info.value, ZephonError)


def test_record_without_text_field_names_the_pointer(tmp_path):
    (tmp_path / "books.jsonl").write_text('{"text": "ok"}\n{"body": "no text here"}\n')
    ds = z.Dataset.from_jsonl("books", str(tmp_path / "books.jsonl"))
    ws = z.MixtureWorkSource([ds], chunk_size=2, shuffle_within_shard=False)
    with pytest.raises(MissingFieldError, match="body") as info:
        compute_chunk(z.Pipeline(ws).tokenize().spec, 0)
    assert "dataset 'books', shard 0" in "\n".join(info.value.__notes__) + str(info.value)
    # a field the tokenizer needs but the reader did not check is named with its pointer (after
    # a map: without one, the build itself refuses it, see tests/unit/test_build_checks.py)
    ok = z.MixtureWorkSource([z.Dataset.from_records("r", [{"text": "a", "x": 1}])], chunk_size=1)
    with pytest.raises(MissingFieldError, match=r"dataset 'r', shard 0, offset 0 .*'title'"):
        compute_chunk(z.Pipeline(ok).map(lambda r: r, version=1).tokenize(field="title").spec, 0)


def test_user_errors_carry_the_pointer_as_a_note():
    ws = z.MixtureWorkSource([z.Dataset.from_records("a", ["x", "boom", "y"])], chunk_size=3,
                             shuffle_within_shard=False)

    def explode(rec):
        if rec["text"] == "boom":
            raise RuntimeError("user bug")
        return rec

    p = z.Pipeline(ws).map(explode).tokenize().options(canonical_replicas=1)
    with pytest.raises(RuntimeError, match="user bug") as info:
        compute_window(p.spec, 0, 0)
    notes = "\n".join(info.value.__notes__)
    assert "dataset 'a', shard 0, offset 1" in notes and "lane 0, window 0" in notes


def test_dask_sees_the_memory_a_window_holds():
    """Dask sizes results with ``sys.getsizeof``; a window must report its arrays, not ~56 bytes."""
    from dask.sizeof import sizeof

    out = compute_window(make_pipeline().spec, 0, 0)
    t = out.table
    arrays = t.tokens.nbytes + t.offsets.nbytes + t.positions.nbytes + t.document_ids.nbytes
    assert sizeof(out) >= arrays + t.lineage.nbytes > 1000
