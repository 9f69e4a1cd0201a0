"""A whole run over a finite stream, and resumes anywhere in it, against the uninterrupted run.

After the stream ends, the next iteration starts the next pass (epoch); a
state loaded into a pipeline applies to one iteration only. The truth is the
uninterrupted run doing the same calls: our iterator (hypothesis over cut
points and abandoned iterations), ``to_torch()``, ``to_torch_loader()`` with 0
and 2 workers, torchdata's ``StatefulDataLoader`` over its own iterations, and
real training runs past the end of the stream in Hugging Face's ``Trainer``,
Lightning and accelerate, resumed before and exactly at the end, with dropout
on: the same batches in the same steps and bit-identical weights. Creating and
resuming our loaders draws nothing from the global RNGs.
"""

from __future__ import annotations

import functools
import json
import random
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_dask as z
from tests.helpers.frameworks import MODEL_FIELDS, VOCAB, record_inputs
from tests.helpers.oracles import batch_rows
from tests.helpers.pipelines import build, write_corpus
from tests.pipeline.test_stateful_loader import dataset_states
from zephon_dask.errors import StateError, ZephonWarning

RESUMES = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models train fastest on one thread, and far faster on one when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A stream of 50 batches of 2 rows (``small``) over 4 lanes that end at different times."""
    root = tmp_path_factory.mktemp("small")
    write_corpus(root / "web", 1, 14, 1, "web")
    write_corpus(root / "code", 1, 10, 2, "code")
    return root


def small(corpus, runner="synchronous", microbatch=2, **options):
    return build(corpus, R=4, k=1, microbatch=microbatch, runner=runner, **options)


@functools.cache
def pass_length(corpus, **options) -> int:
    with small(corpus, **options) as pipe:
        return sum(1 for _ in pipe)


def key(item):
    """A delivered batch (a ``Batch`` or a dict of tensors) as ``(lane, index_in_lane, rows)``;
    ``to_torch()``'s dicts carry no lane (the state after each delivery names it)."""
    if isinstance(item, dict):
        rows = [row[:n].tolist() for row, n in zip(item["tokens"], item["lengths"], strict=True)]
        return int(item.get("lane", -1)), int(item.get("index_in_lane", -1)), rows
    return batch_rows(item)


def drive(pipe, iterate, start, stop, fresh_at=frozenset()):
    """Deliveries ``start..stop-1`` of a loop that starts an iteration (``iterate()``), starts
    another before each delivery in ``fresh_at`` (abandoning the last) and whenever one ends.
    Returns, per delivery, the iteration it came from (counted from 0 here), the batch and
    ``pipe.state_dict()`` after it."""
    it, iteration, out = iterate(), 0, []
    for t in range(start, stop):
        if t in fresh_at:
            it, iteration = iterate(), iteration + 1
        item = next(it, None)
        if item is None:
            it, iteration = iterate(), iteration + 1
            item = next(it)
        out.append((iteration, key(item), pipe.state_dict()))
    return out


# -- our iterator: hypothesis over cut points and abandoned iterations ----------------------


@RESUMES
@given(runner=st.sampled_from(["synchronous", "threads"]), data=st.data())
def test_resumes_anywhere_in_a_run_of_several_passes_equal_the_uninterrupted_run(small_corpus, runner, data):
    n = pass_length(small_corpus)
    total = 2 * n + n // 2
    point = st.one_of(st.integers(0, total), st.sampled_from([n - 1, n, n + 1, 2 * n]))
    fresh_at = frozenset(data.draw(st.sets(st.integers(0, total - 1), max_size=2), label="new iter() at"))
    cuts = sorted(data.draw(st.lists(point, min_size=1, max_size=2), label="cuts"))
    with small(small_corpus, runner) as pipe:
        whole = drive(pipe, lambda: iter(pipe), 0, total, fresh_at)
    if not fresh_at:
        assert [k for _, k, _ in whole[n:2 * n]] == [k for _, k, _ in whole[:n]]  # the second pass
    got, state = [], None
    for cut, end in zip([0, *cuts], [*cuts, total], strict=True):  # successive resumes, fresh pipelines
        pipe = small(small_corpus, runner)
        if state is not None:
            pipe.load_state_dict(json.loads(json.dumps(state)))
        with pipe:
            part = drive(pipe, lambda p=pipe: iter(p), cut, end, fresh_at)
        got += [(k, s) for _, k, s in part]
        state = part[-1][2] if part else state
    assert got == [(k, s) for _, k, s in whole]  # the same batches, and the same state after each


def test_a_restored_pipeline_starts_a_new_pass_after_the_end(small_corpus):
    """The reported case: a state 3 batches before the end; every later ``iter()`` used to
    replay those 3 batches, and ``state_dict()`` stayed put."""
    with small(small_corpus) as pipe:
        it = iter(pipe)
        head = [key(b) for _, b in zip(range(pass_length(small_corpus) - 3), it, strict=False)]
        state = pipe.state_dict()
        rest = [key(b) for b in it]
        second = [key(b) for b in pipe]
        end = pipe.state_dict()
    n = len(head + rest)
    assert len(rest) == 3 and second == head + rest
    per_pass = -(-n // 4)  # 4 batches a step; a pass's last step ends with it
    assert (end["step"]["global_step"], end["step"]["batches_in_step"]) == (per_pass + n // 4, n % 4)
    with small(small_corpus) as pipe:
        pipe.load_state_dict(state)
        tail = [key(b) for b in pipe]
        again = [key(b) for b in pipe]
        assert tail == rest and again == second and pipe.state_dict() == end


# -- to_torch(), to_torch_loader() with 0 and 2 workers, and their ledgers ------------------


ITERATE = {
    "to_torch": lambda pipe: pipe.to_torch,
    "loader0": lambda pipe: pipe.to_torch_loader(num_workers=0).__iter__,
    "loader2": lambda pipe: pipe.to_torch_loader(num_workers=2, multiprocessing_context="fork").__iter__,
}


@pytest.mark.parametrize("via", [pytest.param(via, marks=pytest.mark.slow) if via == "loader2" else via
                                 for via in sorted(ITERATE)])  # slow: worker processes
def test_torch_iterators_and_loaders_resume_across_the_end_of_the_stream(small_corpus, tmp_path, via):
    n = pass_length(small_corpus)
    total, fresh_at = 2 * n + 6, frozenset({n + n // 2})  # two passes; the second left mid-way
    with small(small_corpus, ledger=str(tmp_path / "whole")) as pipe:
        whole = drive(pipe, ITERATE[via](pipe), 0, total, fresh_at)
    lines = (tmp_path / "whole" / "rank-0.jsonl").read_text().splitlines(keepends=True)
    for cut in (n // 2, n, n + 5):
        (tmp_path / f"cut-{cut}").mkdir()  # the run that crashed after `cut` batches logged them
        (tmp_path / f"cut-{cut}" / "rank-0.jsonl").write_text("".join(lines[:cut]))
        with small(small_corpus, ledger=str(tmp_path / f"cut-{cut}")) as pipe:
            pipe.load_state_dict(whole[cut - 1][2])
            resumed = drive(pipe, ITERATE[via](pipe), cut, total, fresh_at)
        if via == "loader2":  # the lanes are split across the workers again at a resume
            first = sum(1 for it, _, _ in resumed if it == 0)
            assert Counter(repr(k) for _, k, _ in resumed[:first]) == Counter(
                repr(k) for _, k, _ in whole[cut:cut + first])
            assert first == 0 or resumed[first - 1][2] == whole[cut + first - 1][2]
            resumed, expected = resumed[first:], whole[cut + first:]
        else:
            expected = whole[cut:]
        assert [(k, s) for _, k, s in resumed] == [(k, s) for _, k, s in expected], f"cut at {cut} of {n}"
        same, report = z.verify_ledgers(tmp_path / "whole", tmp_path / f"cut-{cut}")
        assert same and report.startswith(f"{-(-n // 4) + (total - n) // 4 + 1} global steps"), report


# -- torchdata's StatefulDataLoader over its own iterations -----------------------------------


@pytest.mark.parametrize("workers, whole_steps", [(0, True), (0, False),
                                                  pytest.param(2, False, marks=pytest.mark.slow)])  # slow: workers
def test_stateful_dataloader_epochs_resume_like_the_uninterrupted_loader(small_corpus, workers, whole_steps):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(pipe):
        return StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=workers,
                                  generator=torch.Generator(),
                                  multiprocessing_context="fork" if workers else None)

    def epochs(dl, first_epoch):
        """``(epoch, item, loader state)`` for epochs ``first_epoch``..2, as a loop over epochs does."""
        return [(epoch, key(item), dl.state_dict()) for epoch in range(first_epoch, 3) for item in dl]

    def ours(run):
        """Each item and the pipeline dataset states in the loader state after it."""
        return [(k, dataset_states(s)) for _, k, s in run]

    # with workers, every sample: in a DataLoader of one's own, each worker ends on its own lanes' last
    # whole step when rows are packed (docs/checkpointing.md), so the loader's last steps would depend on them
    n = pass_length(small_corpus, drop_last_step=whole_steps)
    small = functools.partial(globals()["small"], drop_last_step=whole_steps)
    with small(small_corpus) as pipe:
        per_rank, steps = pipe.session.step_shape().per_rank, pipe.num_steps()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ZephonWarning)  # the batches each pass drops
            whole = epochs(loader(pipe), 0)
    assert len(whole) == 3 * n and [k for _, k, _ in whole[n:2 * n]] == [k for _, k, _ in whole[:n]]
    assert (n == steps * per_rank) if whole_steps else (n % per_rank != 0)  # whole steps only, or a short last
    for cut in (n // 2, n, n + 7):  # mid pass 1, after its last item, mid pass 2
        with small(small_corpus, seed=99 if workers == 0 else 5) as pipe:  # the state's seed wins
            dl = loader(pipe)
            dl.load_state_dict(whole[cut - 1][2])
            resumed = epochs(dl, whole[cut - 1][0])
        assert ours(resumed) == ours(whole[cut:]), f"cut at {cut} of {n}"
    if workers:  # fresh workers start the next passes from the pipeline as built: its seed must match
        with small(small_corpus, seed=99) as pipe:
            dl = loader(pipe)
            dl.load_state_dict(whole[n // 2][2])
            with pytest.raises(StateError, match=r"(?s)source.seed: checkpoint 5, pipeline 99.*later pass"):
                next(iter(dl))


# -- real training runs past the end of the stream, resumed before and at the end ----------


def dropout_gpt2():
    """The tiny GPT-2 of ``frameworks.tiny_gpt2`` with dropout on: a resume must restore the RNG."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=16, n_layer=1, n_head=2, bos_token_id=256,
                        eos_token_id=257, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                        tie_word_embeddings=False)
    return GPT2LMHeadModel(config)


def hf_small(corpus):
    """Every sample (``drop_last_step=False``): a pass that is not whole steps."""
    return small(corpus, microbatch=None, drop_last_step=False).batch(2, labels="hf")


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.slow  # a framework
def test_hf_trainer_runs_past_the_end_and_resumes_exactly(small_corpus, tmp_path):
    """Optimizer steps of 4 batches (one global step), a pass of n = 50 batches (not whole steps:
    what the Trainer does with the pass's last 2 batches is its own policy), 16 steps: resumed at
    step 6 (mid pass) and at the first step that ends in the second pass."""
    pytest.importorskip("transformers")
    from transformers import TrainerCallback, TrainingArguments

    from zephon_dask.integrations.hf import ZephonTrainer

    n = pass_length(small_corpus, drop_last_step=False)
    per = hf_small(small_corpus).session.step_shape().per_rank
    steps = 16
    assert n % per and n < steps * per < 2 * n

    class Forwards(TrainerCallback):
        """The model's forward passes so far at the end of each optimizer step."""

        def __init__(self, seen):
            self.seen, self.at = seen, {}

        def on_step_end(self, args, state, control, **kwargs):
            self.at[state.global_step] = len(self.seen)

    def train(out, resume=None):
        model = dropout_gpt2()
        seen = record_inputs(model)
        forwards = Forwards(seen)
        args = TrainingArguments(output_dir=str(out), max_steps=steps, save_strategy="steps", save_steps=1,
                                 learning_rate=1e-3, report_to=[], logging_strategy="no", disable_tqdm=True,
                                 use_cpu=True, seed=0, dataloader_num_workers=0)
        with hf_small(small_corpus) as pipe:
            ZephonTrainer(model=model, args=args, train_dataset=pipe,
                          callbacks=[forwards]).train(resume_from_checkpoint=resume)
        return seen, model, forwards.at

    full, model, at_step = train(tmp_path / "full")
    assert full[n:] == full[:len(full) - n] and len(full) > n  # the second pass starts the stream again
    crossed = min(step for step, count in at_step.items() if count > n)
    for at in (6, crossed):
        resumed, model2, _ = train(tmp_path / f"from-{at}", resume=str(tmp_path / "full" / f"checkpoint-{at}"))
        assert resumed == full[at_step[at]:], f"resumed at step {at}"
        assert same_weights(model, model2), f"resumed at step {at}: dropout drew other numbers"


@pytest.mark.slow  # a framework
def test_lightning_runs_past_the_end_and_resumes_exactly(small_corpus, tmp_path):
    """As for the Trainer; the module has no random generator code (the data module keeps them)."""
    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks import ModelCheckpoint

    from zephon_dask.integrations.lightning import ZephonDataModule

    class TinyLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = dropout_gpt2()
            self.seen = record_inputs(self.model)

        def training_step(self, batch, batch_idx):
            return self.model(**{k: batch[k] for k in MODEL_FIELDS}).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    n = pass_length(small_corpus, drop_last_step=False)
    steps = 16  # optimizer steps of 4 batches (ZephonDataModule sizes the accumulation): past the pass's end

    class Forwards(pl.Callback):
        """The model's forward passes so far when each optimizer step has run."""

        def __init__(self):
            self.at = {}

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.at.setdefault(trainer.global_step, len(module.seen))

    def fit(out, resume=None):
        torch.manual_seed(0)
        module, forwards = TinyLM(), Forwards()
        trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[forwards, ModelCheckpoint(dirpath=str(out), every_n_train_steps=1,
                                                                  save_top_k=-1, filename="{step}")])
        with hf_small(small_corpus) as pipe:
            trainer.fit(module, datamodule=ZephonDataModule(pipe), ckpt_path=resume)
        return module, forwards.at

    full, at_step = fit(tmp_path / "full")
    assert full.seen[n:] == full.seen[:len(full.seen) - n] and len(full.seen) > n
    crossed = min(step for step, count in at_step.items() if count > n)
    for at in (6, crossed):
        resumed, _ = fit(tmp_path / f"from-{at}", resume=str(tmp_path / "full" / f"step={at}.ckpt"))
        assert resumed.seen == full.seen[at_step[at]:], f"resumed at step {at}"
        assert same_weights(full, resumed), f"resumed at step {at}: dropout drew other numbers"


@pytest.mark.slow  # a framework
def test_accelerate_runs_past_the_end_and_resumes_exactly(small_corpus, tmp_path):
    """``save_state``/``load_state`` (which keep the RNGs) around a loop that starts a new
    iteration of the loader when one ends."""
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from zephon_dask.integrations.accelerate import prepare_pipeline

    n = pass_length(small_corpus, drop_last_step=False)
    steps, save = n + 8, n // 2

    def run(first, load=None):
        accelerator = Accelerator(cpu=True)
        model = dropout_gpt2()
        seen = record_inputs(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        with hf_small(small_corpus) as pipe:
            loader = prepare_pipeline(accelerator, pipe)
            if load is not None:
                accelerator.load_state(load)
            batches = iter(loader)
            for step in range(first, steps):
                batch = next(batches, None)
                if batch is None:  # the end of the stream: the next pass
                    batches = iter(loader)
                    batch = next(batches)
                loss = model(**{k: batch[k] for k in MODEL_FIELDS}).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if load is None and (step + 1) % save == 0:
                    accelerator.save_state(str(tmp_path / f"state-{step + 1}"))
        return seen, accelerator.unwrap_model(model)

    full, model = run(0)
    assert full[n:] == full[:steps - n]
    for at in (save, n):
        resumed, model2 = run(at, load=str(tmp_path / f"state-{at}"))
        assert resumed == full[at:], f"resumed at step {at}"
        assert same_weights(model, model2), f"resumed at step {at}: dropout drew other numbers"


# -- no global RNG draws ------------------------------------------------------------------------


def rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def assert_rngs_untouched(before, what):
    after = rng_states()
    assert torch.equal(before[0], after[0]), f"{what} drew from torch's global RNG"
    assert all(np.array_equal(a, b) for a, b in zip(before[1], after[1], strict=True)), \
        f"{what} drew from numpy's global RNG"
    assert before[2] == after[2], f"{what} drew from Python's global random"


@pytest.mark.parametrize("runner", ["synchronous", pytest.param("distributed", marks=pytest.mark.slow)])  # slow: a cluster
def test_loaders_draw_nothing_from_the_global_rngs(small_corpus, runner):
    """Every loader, created, iterated and resumed (a pass and a half), with the in-process runner
    and with an embedded Dask cluster; and a StatefulDataLoader given a generator, as documented."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    before = rng_states()
    with small(small_corpus, runner) as pipe:
        made = {
            "iter": lambda: iter(pipe),
            "to_torch": pipe.to_torch,
            "to_torch_loader(0)": lambda: iter(pipe.to_torch_loader()),
            "to_torch_loader(2)": lambda: iter(pipe.to_torch_loader(num_workers=2, multiprocessing_context="fork")),
        }
        for what, make in made.items():
            for _ in zip(range(30), make(), strict=False):
                pass
            assert_rngs_untouched(before, what)
        pipe.load_state_dict(pipe.state_dict())
        loader = pipe.to_torch_loader(num_workers=2, multiprocessing_context="fork")
        for _ in range(2):
            for _ in loader:
                pass
        assert_rngs_untouched(before, "a resumed to_torch_loader(2) over a pass and a half")
    if runner == "synchronous":
        with small(small_corpus, runner) as pipe:
            dl = StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=2,
                                    generator=torch.Generator(), multiprocessing_context="fork")
            for _ in zip(range(5), dl, strict=False):
                pass
            dl.load_state_dict(dl.state_dict())
            next(iter(dl))
            assert_rngs_untouched(before, "a StatefulDataLoader with its own generator")


def test_our_loader_has_a_deterministic_generator_of_its_own(small_corpus):
    with small(small_corpus) as a, small(small_corpus) as b, small(small_corpus, seed=6) as c:
        seeds = [pipe.to_torch_loader().generator.initial_seed() for pipe in (a, b, c)]
        given = torch.Generator().manual_seed(3)
        assert a.to_torch_loader(generator=given).generator is given
    assert seeds[0] == seeds[1] != seeds[2]


# -- states a loader cannot take, named -------------------------------------------------------


def test_a_stateful_dataloader_state_of_another_worker_count_is_refused_by_name(small_corpus):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(pipe, workers):
        return StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    states = {}
    for workers in (0, 2):
        with small(small_corpus) as pipe:
            dl = loader(pipe, workers)
            for _ in zip(range(5), dl, strict=False):
                pass
            states[workers] = dl.state_dict()
    with small(small_corpus) as pipe:
        dl = loader(pipe, 0)
        check = dl.dataset.check_loader_state
        check(states[0], 0)
        with pytest.raises(StateError, match=r"num_workers=2, but it is loaded with num_workers=0.*"
                                             r"resume with num_workers=2.*to_torch_loader"):
            check(states[2], 0)
        with pytest.raises(StateError, match="num_workers=0, but it is loaded with num_workers=2"):
            check(states[0], 2)
        with pytest.raises(StateError, match="no zephon_dask dataset state"):
            check({"_snapshot": {}}, 0)
        with pytest.raises(StateError, match="num_workers=2, but it is loaded with num_workers=0"):
            dl.load_state_dict(states[2])  # checked there: torchdata would raise a bare AssertionError


def test_to_torch_dataset_refuses_a_loaded_state_it_could_not_apply_once(small_corpus):
    with small(small_corpus) as pipe:
        it = iter(pipe)
        next(it)
        state = pipe.state_dict()
    with small(small_corpus) as pipe:
        pipe.load_state_dict(state)
        with pytest.raises(StateError, match="to_torch_loader.*StatefulDataLoader"):
            pipe.to_torch_dataset()
        next(iter(pipe))  # applied: a dataset made now starts a new pass
        assert pipe.to_torch_dataset().state_dict()["state"]["lanes"]["0"]["batches_delivered"] == 0
