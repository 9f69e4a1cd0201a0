"""The two label conventions against a per-token reference (``consumer/batch.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_dask.consumer import BatchOptions, make_batch
from zephon_dask.errors import ConfigError, ZephonError
from zephon_dask.operators.table import SampleTable

IGNORE = -100

# a row: the lengths of its documents, then trailing padding slots
rows = st.lists(st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(0, 3)),
                min_size=1, max_size=4)


def table_of(spec, seed: int) -> SampleTable:
    rng = np.random.default_rng(seed)
    tokens, positions, doc_ids, offsets, doc = [], [], [], [0], 0
    for docs, pad in spec:
        for n in docs:
            tokens += rng.integers(1, 50, n).tolist()
            positions += list(range(n))
            doc_ids += [doc] * n
            doc += 1
        tokens += [0] * pad
        positions += [0] * pad
        doc_ids += [-1] * pad
        offsets.append(len(tokens))
    n = len(spec)
    return SampleTable(np.array(tokens, np.int32), np.array(offsets, np.int64), np.array(positions, np.int32),
                       np.array(doc_ids, np.int32), np.zeros((n, 5), np.int64), np.arange(n + 1, dtype=np.int64))


def reference_hf_labels(tokens, doc_ids, mask_boundaries: bool):
    """Per token, from the definition: the target at ``t`` is token ``t``, predicted from ``t - 1``."""
    out = np.full_like(tokens, IGNORE)
    for r in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            here, before = doc_ids[r, t], doc_ids[r, t - 1]
            if here >= 0 and before >= 0 and (not mask_boundaries or here == before):
                out[r, t] = tokens[r, t]
    return out


@settings(max_examples=60, deadline=None)
@given(spec=rows, seed=st.integers(0, 2**16), mask=st.booleans())
def test_hf_labels_match_the_reference_and_the_shifted_convention(spec, seed, mask):
    table = table_of(spec, seed)
    hf = make_batch(table, 0, 0, BatchOptions(len(spec), labels="hf", mask_document_boundaries=mask))
    shifted = make_batch(table, 0, 0, BatchOptions(len(spec), labels=True, mask_document_boundaries=mask))
    want = reference_hf_labels(hf["tokens"], hf["document_ids"], mask)
    assert (hf["labels"] == want).all()
    assert (hf["labels"][:, 1:] == shifted["labels"][:, :-1]).all()
    assert (shifted["labels"][:, -1] == IGNORE).all() and (hf["labels"][:, 0] == IGNORE).all()
    assert (hf["loss_mask"] == (want != IGNORE)).all()
    assert (hf["input_ids"] == hf["tokens"]).all()
    assert (hf["attention_mask"] == (hf["document_ids"] >= 0)).all()
    assert (hf["position_ids"] == hf["positions"]).all()
    assert "attention_mask" not in shifted and "position_ids" not in shifted


def test_hf_batch_trains_a_causal_lm_on_next_tokens():
    """Hugging Face's own loss on ``model(**batch)`` equals cross-entropy on the shifted targets."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    table = table_of([([3, 4], 2), ([6], 0), ([2, 2, 1], 3)], seed=1)
    hf = make_batch(table, 0, 0, BatchOptions(3, labels="hf", mask_document_boundaries=True)).to_torch()
    shifted = make_batch(table, 0, 0, BatchOptions(3, labels=True, mask_document_boundaries=True)).to_torch()
    fields = {k: hf[k] for k in ("input_ids", "labels", "attention_mask", "position_ids")}
    with torch.no_grad():
        out = model(**fields)
        want = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), shifted["labels"].flatten(),
                                                 ignore_index=IGNORE)
    assert torch.allclose(out.loss, want)


@pytest.mark.parametrize("bad", ["HF", "next", 1, 2, None])
def test_unknown_label_convention_is_refused(bad):
    with pytest.raises(ConfigError, match="labels=") as info:
        BatchOptions(2, labels=bad)
    assert isinstance(info.value, ZephonError) and isinstance(info.value, ValueError)


def test_importing_the_package_and_the_guard_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys, zephon_dask, zephon_dask.integrations, zephon_dask.pipeline.torch_data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('transformers', 'accelerate', 'pytorch_lightning', 'lightning')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
