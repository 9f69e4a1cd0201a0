"""Hugging Face Trainer fed by a pipeline: shapes, exact O(1) resume, one optimizer step per global step
(also after a microbatch change), true batch sizes, evaluation, typed errors for the stock Trainer."""

from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from tests.helpers.frameworks import (  # noqa: E402
    digest,
    hand_eval,
    hf_eval_pipeline,
    hf_pipeline,
    record_eval_inputs,
    record_inputs,
    tiny_gpt2,
)
from zephon_dask.errors import (  # noqa: E402
    ConfigError,
    ShardingError,
    StateError,
    UnsizedPipelineError,
    ZephonError,
)
from zephon_dask.integrations.hf import (  # noqa: E402
    STATE_FILE,
    ZephonTrainer,
    ZephonTrainerMixin,
    checkpoint_state,
)
from zephon_dask.state import save_state  # noqa: E402

STEPS, SAVE_AT = 4, 2  # optimizer steps
PER_STEP = 4  # batches per optimizer step: the pipeline's global step, 4 lanes at dp=1
MICROBATCH = 2


def args(out, **kw):
    kw = {"max_steps": STEPS, "save_strategy": "steps", "save_steps": SAVE_AT, "logging_strategy": "no", **kw}
    return TrainingArguments(output_dir=str(out), learning_rate=1e-3, report_to=[], disable_tqdm=True,
                             use_cpu=True, seed=0, dataloader_num_workers=0, **kw)


def record_rows(model) -> list[list[str]]:
    """Per training forward, the digests of its rows."""
    seen: list[list[str]] = []

    def hook(module, a, kw):
        if module.training:
            seen.append([digest(row) for row in kw["input_ids"]])

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def train(corpus_dir, out, resume=None, microbatch=MICROBATCH, model=None, eval_dataset=None, **kw):
    """A ZephonTrainer run: (trainer, its train() metrics, batch digests, rows per batch)."""
    model = model or tiny_gpt2()
    seen, rows = record_inputs(model), record_rows(model)
    with hf_pipeline(corpus_dir, batch={"microbatch_size": microbatch}) as pipe:
        trainer = ZephonTrainer(model=model, args=args(out, **kw), train_dataset=pipe, eval_dataset=eval_dataset)
        metrics = trainer.train(resume_from_checkpoint=resume).metrics
    return trainer, metrics, seen, rows


def stream(corpus_dir, n, **options):
    """The first ``n`` batches of the pipeline's own iterator, as the model would receive them."""
    with hf_pipeline(corpus_dir, **options) as pipe:
        return [digest(torch.from_numpy(b["input_ids"])) for b, _ in zip(pipe, range(n), strict=False)]


@pytest.fixture(scope="module")
def full(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    trainer, metrics, seen, rows = train(corpus_dir, out)
    return {"out": out, "trainer": trainer, "metrics": metrics, "seen": seen, "rows": rows}


def test_trainer_receives_the_pipeline_stream_and_resumes_exactly(full, corpus_dir, tmp_path):
    assert full["seen"] == stream(corpus_dir, STEPS * PER_STEP)  # one pipeline batch per micro-batch
    checkpoint = full["out"] / f"checkpoint-{SAVE_AT}"
    assert (checkpoint / STATE_FILE).is_file()
    model = tiny_gpt2()
    _, _, resumed, _ = train(corpus_dir, tmp_path, resume=str(checkpoint), model=model)
    assert resumed == full["seen"][SAVE_AT * PER_STEP:]  # no batch replayed, skipped or re-iterated
    for a, b in zip(full["trainer"].model.parameters(), model.parameters(), strict=True):
        assert (a == b).all()  # and the same weights at the end


def test_one_optimizer_step_is_one_global_step_and_the_batch_size_is_the_microbatch(full):
    trainer, metrics = full["trainer"], full["metrics"]
    assert trainer.args.gradient_accumulation_steps == PER_STEP
    assert trainer.args.per_device_train_batch_size == MICROBATCH  # what "batch size per device" logs
    samples = STEPS * PER_STEP * MICROBATCH
    assert trainer.get_total_train_batch_size(trainer.args) == PER_STEP * MICROBATCH
    assert math.isclose(metrics["train_samples_per_second"] * metrics["train_runtime"], samples, rel_tol=0.01)


def test_a_resume_with_another_microbatch_keeps_the_global_steps(full, corpus_dir, tmp_path):
    """The checkpoint's global step holds 8 samples: with microbatch 1 that is 8 batches per step, set
    after the state is loaded (sizing it from the fresh pipeline would make each step half of one)."""
    trainer, _, _, rows = train(corpus_dir, tmp_path, resume=str(full["out"] / f"checkpoint-{SAVE_AT}"),
                                microbatch=1)
    assert trainer.args.gradient_accumulation_steps == 2 * PER_STEP
    per_step = [sorted(sum(rows[i:i + 2 * PER_STEP], [])) for i in range(0, len(rows), 2 * PER_STEP)]
    want = [sorted(sum(full["rows"][i:i + PER_STEP], [])) for i in range(SAVE_AT * PER_STEP, len(full["rows"]),
                                                                       PER_STEP)]
    assert per_step == want  # each later global step trains the same samples


def test_a_resume_logs_the_epoch_and_speeds_of_the_whole_run(corpus_dir, tmp_path):
    """The epoch goes on from the checkpoint's as in the uninterrupted run (the Trainer, skipping no
    batch, restarted it at 0), and the speeds count what this run trained: speed x runtime is this
    run's tokens and samples."""
    logging = {"logging_strategy": "steps", "logging_steps": 1, "include_num_input_tokens_seen": "all"}
    whole, _, _, _ = train(corpus_dir, tmp_path / "whole", **logging)
    trainer, metrics, _, _ = train(corpus_dir, tmp_path / "resumed", **logging,
                                   resume=str(tmp_path / "whole" / f"checkpoint-{SAVE_AT}"))
    expected = [(log["step"], log["epoch"]) for log in whole.state.log_history if "loss" in log]
    assert expected == [(s, s / STEPS) for s in range(1, STEPS + 1)]
    logs = [log for log in trainer.state.log_history if "loss" in log and log["step"] > SAVE_AT]
    assert [(log["step"], log["epoch"]) for log in logs] == expected[SAVE_AT:]
    assert metrics["epoch"] == 1.0
    saved = json.loads((tmp_path / "resumed" / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert saved["epoch"] == 1.0
    per_step = logs[1]["num_input_tokens_seen"] - logs[0]["num_input_tokens_seen"]
    for log in logs:
        session = log["num_input_tokens_seen"] - SAVE_AT * per_step
        assert math.isclose(log["train_tokens_per_second"] * log["train_runtime"], session, rel_tol=0.02)
    samples = (STEPS - SAVE_AT) * PER_STEP * MICROBATCH
    assert math.isclose(metrics["train_samples_per_second"] * metrics["train_runtime"], samples, rel_tol=0.01)


def test_a_gradient_accumulation_that_is_not_the_global_step_is_refused(corpus_dir, tmp_path):
    with hf_pipeline(corpus_dir) as pipe:
        with pytest.raises(ConfigError, match=f"{PER_STEP} batches per rank"):
            ZephonTrainer(model=tiny_gpt2(), args=args(tmp_path, gradient_accumulation_steps=3), train_dataset=pipe)


def test_model_receives_hf_fields_with_batch_shape(corpus_dir, tmp_path):
    model = tiny_gpt2()
    shapes = []
    model.register_forward_pre_hook(lambda m, a, kw: shapes.append({k: tuple(v.shape) for k, v in kw.items()
                                                                     if hasattr(v, "shape")}), with_kwargs=True)
    with hf_pipeline(corpus_dir) as pipe:
        ZephonTrainer(model=model, args=args(tmp_path, max_steps=1, save_strategy="no"), train_dataset=pipe).train()
    assert set(shapes[0]) - {"num_items_in_batch"} == {"input_ids", "labels", "attention_mask", "position_ids"}
    assert all(len(s) == 2 and s[0] == 2 for shape in shapes for k, s in shape.items() if k != "num_items_in_batch")


@pytest.mark.parametrize("batch,match", [({"labels": True}, "labels='hf'"),
                                         ({"labels": "hf", "ignore_index": -1}, "ignore_index=-100")])
def test_labels_a_model_cannot_take_are_refused(corpus_dir, tmp_path, batch, match):
    with hf_pipeline(corpus_dir, batch=batch) as pipe:
        with pytest.raises(ConfigError, match=match):
            ZephonTrainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=pipe)


def test_stock_trainer_on_the_dataset_is_refused(corpus_dir, tmp_path):
    """The stock Trainer hands the dataset to accelerate's dispatcher, which would re-split it."""
    with hf_pipeline(corpus_dir) as pipe:
        trainer = Trainer(model=tiny_gpt2(), args=args(tmp_path, max_steps=2, save_strategy="no"),
                          train_dataset=pipe.to_torch_dataset())
        with pytest.raises(ShardingError, match="ZephonTrainer") as info:
            trainer.train()
    assert isinstance(info.value, ZephonError) and isinstance(info.value, RuntimeError)


def test_the_mixin_listed_after_a_trainer_says_to_list_it_first():
    class SubTrainer(Trainer):
        pass

    for bases in ((Trainer, ZephonTrainerMixin), (SubTrainer, ZephonTrainerMixin)):
        with pytest.raises(ConfigError, match=rf"lists {bases[0].__name__} before ZephonTrainerMixin.*"
                                              rf"List the mixin first: class Mine\(ZephonTrainerMixin, "
                                              rf"{bases[0].__name__}\)"):
            type("Mine", bases, {})
    with pytest.raises(ConfigError, match=r"lists SubTrainer before.*class Mine\(ZephonTrainer, SubTrainer\)"):
        type("Mine", (SubTrainer, ZephonTrainer), {})

    class Mine(ZephonTrainerMixin, SubTrainer):  # the order the mixin asks for, and subclasses of it
        pass

    class Yours(Mine):
        pass

    class Theirs(ZephonTrainer):
        pass

    assert Yours.get_train_dataloader is ZephonTrainerMixin.get_train_dataloader is Theirs.get_train_dataloader


def test_a_checkpoint_without_its_data_state_names_the_file_and_the_earlier_one(corpus_dir, tmp_path):
    """The weights are saved before the data state, so a run stopped in between leaves the newest
    checkpoint-N without it: the error names the missing file and the latest earlier checkpoint with one."""
    with hf_pipeline(corpus_dir) as pipe:
        state = pipe.state_dict()
        for step in (0, 1, 2, 3, 10):
            (tmp_path / f"checkpoint-{step}").mkdir()
        for step in (1, 2):
            save_state(tmp_path / f"checkpoint-{step}" / STATE_FILE, state)
        trainer = ZephonTrainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=pipe)
        with pytest.raises(StateError, match=re.escape(f"{tmp_path / 'checkpoint-10' / STATE_FILE} is missing")
                           + ".*stopped in between.*" + re.escape(f"{tmp_path / 'checkpoint-2'} has one")):
            trainer.train(resume_from_checkpoint=True)
    with pytest.raises(StateError, match=re.escape(f"{tmp_path / 'checkpoint-3' / STATE_FILE} is missing")
                       + ".*" + re.escape(f"{tmp_path / 'checkpoint-2'} has one")):
        checkpoint_state(tmp_path / "checkpoint-3")
    with pytest.raises(StateError, match="no earlier checkpoint-N beside it has one"):
        checkpoint_state(tmp_path / "checkpoint-0")
    assert checkpoint_state(tmp_path / "checkpoint-2") == state


@pytest.mark.parametrize("accelerator_config", [None, {"dispatch_batches": False}])
def test_stock_trainer_given_the_pipeline_names_zephon_trainer(corpus_dir, tmp_path, accelerator_config):
    """The stock Trainer (also with accelerate's DataLoaderShard) takes a pipeline for a map-style
    dataset and asks its len() before the first batch, for training and for evaluation."""
    kw = {} if accelerator_config is None else {"accelerator_config": accelerator_config}
    with hf_eval_pipeline(corpus_dir / "code") as held_out, hf_pipeline(corpus_dir) as pipe:
        trainer = Trainer(model=tiny_gpt2(), args=args(tmp_path, max_steps=2, save_strategy="no", **kw),
                          train_dataset=pipe, eval_dataset=held_out)
        with pytest.raises(UnsizedPipelineError, match="ZephonTrainer") as info:
            trainer.train()
        assert isinstance(info.value, TypeError)
        with pytest.raises(UnsizedPipelineError, match="ZephonTrainer"):
            trainer.evaluate()
        assert bool(pipe) and len(list(zip(pipe, range(2)))) == 2  # truth tests and list() still work


def test_evaluation_pipelines_restart_each_time_and_leave_training_as_it_was(full, corpus_dir, eval_corpus_dir,
                                                                             tmp_path):
    def run(out, resume=None):
        model = tiny_gpt2()
        evaluated = record_eval_inputs(model)
        with hf_eval_pipeline(eval_corpus_dir) as a, hf_eval_pipeline(eval_corpus_dir, microbatch=4) as b:
            trainer, _, seen, _ = train(corpus_dir, tmp_path / out, resume=resume, model=model,
                                        eval_dataset={"a": a, "b": b}, eval_strategy="steps", eval_steps=SAVE_AT)
            evaluated = list(evaluated)  # what the trainer evaluated, before the oracle runs the model
            by_hand = {name: hand_eval(model, p) for name, p in (("a", a), ("b", b))}
        history = {(h["step"], k): v for h in trainer.state.log_history for k, v in h.items()
                   if k.startswith("eval_") and k.endswith("_loss")}
        return model, seen, evaluated, history, by_hand

    model, seen, evaluated, history, by_hand = run("evaluated")
    assert seen == full["seen"]  # the same run without evaluation
    for p, q in zip(full["trainer"].model.parameters(), model.parameters(), strict=True):
        assert (p == q).all()
    # the checkpoint written right after the step-2 evaluation: the same data position, and the same
    # random number generator states (the evaluation drew no random number)
    saved = [full["out"] / f"checkpoint-{SAVE_AT}", tmp_path / "evaluated" / f"checkpoint-{SAVE_AT}"]
    assert (saved[0] / STATE_FILE).read_bytes() == (saved[1] / STATE_FILE).read_bytes()
    rng = [torch.load(s / "rng_state.pth", weights_only=False) for s in saved]
    assert torch.equal(rng[0]["cpu"], rng[1]["cpu"]) and rng[0]["python"] == rng[1]["python"]
    assert all((x == y).all() for x, y in zip(rng[0]["numpy"][1:2], rng[1]["numpy"][1:2]))

    # two evaluations (steps 2 and 4), each over both streams from their beginning
    assert evaluated == (by_hand["a"][2] + by_hand["b"][2]) * 2
    for name in ("a", "b"):  # the last evaluation saw the final weights: the loss per label token
        total, count, _ = by_hand[name]
        assert math.isclose(history[(STEPS, f"eval_{name}_loss")], total / count, rel_tol=1e-6)

    # a resume from the step-2 checkpoint evaluates exactly as the uninterrupted run
    _, resumed_seen, _, resumed_history, _ = run("resumed", resume=str(saved[1]))
    assert resumed_seen == seen[SAVE_AT * PER_STEP:]
    assert {k: v for k, v in history.items() if k[0] > SAVE_AT} == {k: v for k, v in resumed_history.items()
                                                                   if k[0] > SAVE_AT}


def test_bad_evaluation_pipelines_are_refused(corpus_dir, eval_corpus_dir, tmp_path):
    import zephon_dask as z

    endless = z.Pipeline(z.MixtureWorkSource([z.Dataset.from_jsonl("held", str(eval_corpus_dir), progress=False)],
                                             chunk_size=4, exhausted_policy="repeat"))
    endless = endless.tokenize().pack(96).batch(2, labels="hf").options(canonical_replicas=4)
    with hf_pipeline(corpus_dir) as pipe, hf_eval_pipeline(eval_corpus_dir) as held_out:
        cases = [({"eval_dataset": pipe}, "the training pipeline"),
                 ({"eval_dataset": {"x": endless}}, r"eval_dataset\['x'\] pipeline never ends"),
                 ({"eval_dataset": held_out, "compute_metrics": lambda p: {}}, "compute_metrics")]
        for kw, match in cases:
            with pytest.raises(ConfigError, match=match):
                ZephonTrainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=pipe, **kw)


def with_domain(record):
    return {**record, "domain": len(record["text"]) % 3}


def test_kept_fields_and_dataset_ids_reach_compute_loss_not_the_model(corpus_dir, tmp_path):
    """A batch with ``domain`` (kept) and ``dataset_ids``: the model gets only its forward's fields,
    a ``compute_loss`` override reads the others (a per-domain loss), no TypeError."""
    import zephon_dask as z

    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    code = z.Dataset.from_jsonl("code", str(corpus_dir / "code"), progress=False)
    ws = z.MixtureWorkSource([web, code], {"web": 3, "code": 1}, chunk_size=12, seed=5)
    pipe = (z.Pipeline(ws).map(with_domain, name="with_domain", version=1).tokenize(keep=["domain"])
            .pack(96, algorithm="best_fit").batch(2, labels="hf", dataset_ids=True)
            .options(canonical_replicas=4, flush_every_k_chunks=1, runner="synchronous"))
    model, given, extras = tiny_gpt2(), [], []
    model.register_forward_pre_hook(lambda m, a, kw: given.append(set(kw) - {"num_items_in_batch"}),
                                    with_kwargs=True)

    class PerDomain(ZephonTrainer):
        def compute_loss(self, model, inputs, *a, **kw):
            extras.append({k: tuple(inputs[k].shape) for k in ("domain", "dataset_ids", "input_ids")})
            return super().compute_loss(model, inputs, *a, **kw)

    with pipe:
        trainer = PerDomain(model=model, args=args(tmp_path, max_steps=2, save_strategy="no"), train_dataset=pipe)
        trainer.train()
    assert given and all(g == {"input_ids", "labels", "attention_mask", "position_ids"} for g in given)
    assert extras and all(e["domain"] == e["dataset_ids"] == e["input_ids"] for e in extras)
    assert set(trainer.batch_extras) == {"domain", "dataset_ids"}


def test_forward_fields_follow_the_signature():
    from zephon_dask.integrations.forward import forward_fields

    available = ("input_ids", "labels", "attention_mask", "position_ids", "domain", "dataset_ids")

    def named(input_ids, labels=None, domain=None):
        pass

    def wrapper(*args, **kwargs):
        pass

    assert forward_fields(named, available) == ("input_ids", "labels", "domain")
    assert forward_fields(wrapper, available) == available[:4]
    assert forward_fields(tiny_gpt2(), available) == available[:4]


@pytest.mark.parametrize("drop_last_step", [True, False])
def test_no_optimizer_step_trains_an_odd_number_of_micro_batches(tmp_path, drop_last_step):
    """A pass of 2 lanes with 4 and 5 micro-batches, 4 per global step (2 of each lane): 2 whole steps
    and 1 batch more. The Trainer goes on past the end of the stream; by default every optimizer
    step trains 4 micro-batches. Keeping every sample, the pass's last batch joins the next pass's first
    4 in one optimizer step (5 micro-batches), and every later step is shifted against the pipeline's."""
    import zephon_dask as z
    from tests.helpers.pipelines import write_corpus

    root = write_corpus(tmp_path / "web", n_files=1, docs=4, seed=7)
    source = z.MixtureWorkSource([z.Dataset.from_jsonl("web", str(root), progress=False)], chunk_size=1, seed=0)
    pipe = z.Pipeline(source).tokenize().pack(128, algorithm="wrap").batch(1, labels="hf").options(
        canonical_replicas=2, global_batches_per_step=4, runner="synchronous", drop_last_step=drop_last_step)
    lanes = sorted(sum(1 for b in pipe.options(drop_last_step=False) if b.lane == lane) for lane in (0, 1))
    assert lanes == [4, 5] and pipe.num_steps() == 2
    model = tiny_gpt2()
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: forwards.append(m.training), with_kwargs=True)
    per_step: list[int] = []

    class Count(TrainerCallback):
        def on_step_end(self, *a, **kw):
            per_step.append(sum(forwards))
            forwards.clear()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only contend
    try:
        with pipe:
            ZephonTrainer(model=model, args=args(tmp_path / "out", max_steps=3, save_strategy="no"),
                          train_dataset=pipe, callbacks=[Count()]).train()
    finally:
        torch.set_num_threads(threads)
    assert per_step == ([4, 4, 4] if drop_last_step else [4, 4, 5])  # the third: the pass's last, the next's 4
