"""docs/architecture.md's "What a change touches", checked where a test can: a new record
operator, runner or data option is defined here, in the test, and works with nothing else edited
(operators and runners say what they can do as class attributes, not by their type or name)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import zephon_dask as z
from zephon_dask import options as options_module
from zephon_dask.core import phases
from zephon_dask.core import spec as spec_module
from zephon_dask.core.spec import PipelineSpec
from zephon_dask.execution import RUNNERS, Runner, WindowHandle
from zephon_dask.inspect import counting
from zephon_dask.operators.base import RecordOp
from zephon_dask.validate import check_choice


class Upper(RecordOp):
    """A new 1:1 record operator: its class, and nothing else."""

    name = "upper"
    one_to_one = True

    def apply(self, record: dict) -> list[dict]:
        return [{**record, "text": record["text"].upper()}]

    def spec(self) -> dict:
        return {"op": self.name}


class Inline(Runner):
    """A new runner: its class and one registry entry (the test adds both)."""

    name = "inline"
    computes_in_caller = True

    def submit(self, graph, priority: int) -> WindowHandle:
        return WindowHandle(graph, compute=lambda: self._run_local(graph))


def _source(**kw) -> z.MixtureWorkSource:
    docs = [f"document {i} " * (1 + i % 3) for i in range(64)]
    return z.MixtureWorkSource([z.Dataset.from_records("d", [{"text": t} for t in docs])], seed=3,
                               chunk_size=4, **kw)


def test_a_new_one_to_one_operator_keeps_step_counts_and_schedules_exact():
    base = z.Pipeline(_source()).tokenize().batch(2).options(canonical_replicas=2, flush_every_k_chunks=2)
    spec = dataclasses.replace(base.spec, record_ops=(Upper(), *base.spec.record_ops))
    assert counting.known_rows(spec) is not None  # from the curriculum: nothing computed, nothing estimated
    scheduled = _source(schedule=[(0, {"d": 1}), (3, {"d": 1})], schedule_unit="step")
    plan = phases.plan(dataclasses.replace(spec, source=scheduled), global_batches=2, microbatch=2)
    assert all(p.exact for p in plan)
    silent = type("Silent", (Upper,), {"one_to_one": RecordOp.one_to_one})  # says nothing: measured
    assert counting.known_rows(dataclasses.replace(spec, record_ops=(*spec.record_ops, silent()))) is None


def test_a_new_runner_needs_its_class_and_a_registry_entry(monkeypatch):
    monkeypatch.setitem(RUNNERS, "inline", Inline)
    names = (*options_module.RUNNER_NAMES, "inline")  # its name in RUNNER_NAMES
    monkeypatch.setitem(options_module.BY_NAME, "runner", dataclasses.replace(
        options_module.BY_NAME["runner"], choices=names, validate=lambda v, name: check_choice(v, names, name)))
    base = z.Pipeline(_source()).tokenize().batch(2).options(canonical_replicas=2, flush_every_k_chunks=2)
    with base.options(runner="synchronous") as reference, base.options(runner="inline") as mine:
        want = [b["tokens"].tobytes() for b in reference]
        assert [b["tokens"].tobytes() for b in mine] == want and want
        assert isinstance(mine.session.runner(), Inline)
    assert "no Dask dashboard" in str(base.options(runner="inline").explain())


def test_the_runner_registry_imports_a_runners_module_only_when_asked():
    """Looking the distributed runner up imports its module, which imports ``distributed`` only
    once a cluster or a client is used (:func:`~zephon_dask.execution.cluster.use_distributed`)."""
    code = ("import sys, zephon_dask.pipeline, zephon_dask.execution as e; "
            "assert 'zephon_dask.execution.cluster' not in sys.modules; "
            "assert e.RUNNERS['distributed'].has_dashboard and 'zephon_dask.execution.cluster' in sys.modules; "
            "assert 'distributed' not in sys.modules; "
            "from zephon_dask.execution.cluster import use_distributed; use_distributed(); "
            "assert 'distributed' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_new_data_option_is_a_field_of_the_spec(monkeypatch):
    assert set(options_module.DATA_OPTIONS) <= {f.name for f in dataclasses.fields(PipelineSpec)}

    @dataclasses.dataclass(frozen=True, eq=False)
    class Spec(PipelineSpec):
        window_overlap: int = 0  # a new data option's field

    monkeypatch.setattr(spec_module, "DATA_OPTIONS", (*options_module.DATA_OPTIONS, "window_overlap"))
    settings = {**options_module.DEFAULTS, "window_overlap": 2}
    spec = Spec.of(_source(), (), (), settings)
    assert spec.config()["window_overlap"] == 2  # recorded, so in the fingerprint and every checkpoint
    assert spec.fingerprint != Spec.of(_source(), (), (), {**settings, "window_overlap": 1}).fingerprint


def test_a_new_execution_option_reaches_its_reader_through_the_settings_object(monkeypatch):
    """A new execution option the consumer reads is one ``Option``, a field of that name in
    ``ConsumerSettings`` and the code that reads it (here, the fetcher's ``get``): the value goes
    from ``options()`` to the reader through the settings object, and no signature between them
    (``Session.open_stream``, ``BatchStream``, ``WindowFetcher``, ``ConsumerSettings.from_options``)
    is edited. Before the settings object, such an option was threaded through 5 signatures."""
    import inspect

    from zephon_dask.consumer import fetcher as fetcher_module
    from zephon_dask.consumer.settings import ConsumerSettings
    from zephon_dask.consumer.stream import BatchStream
    from zephon_dask.pipeline import session as session_module
    from zephon_dask.validate import check_bool

    path = (session_module.Session.open_stream, BatchStream.__init__, fetcher_module.WindowFetcher.__init__,
            ConsumerSettings.from_options)
    signatures = [inspect.signature(f) for f in path]
    option = options_module.Option("trace_windows", False, "execution", (bool,), "log every window taken",
                                   check_bool)  # the Option in options.py
    monkeypatch.setattr(options_module, "OPTIONS", (*options_module.OPTIONS, option))
    monkeypatch.setitem(options_module.BY_NAME, option.name, option)
    monkeypatch.setitem(options_module.DEFAULTS, option.name, option.default)
    settings = dataclasses.make_dataclass("ConsumerSettings", [(option.name, bool, False)],
                                          bases=(ConsumerSettings,), frozen=True)  # its field
    monkeypatch.setattr(session_module, "ConsumerSettings", settings)
    read: list[bool] = []
    get = fetcher_module.WindowFetcher.get

    def reading_get(self, lane):  # the code that reads it
        read.append(self.settings.trace_windows)
        return get(self, lane)

    monkeypatch.setattr(fetcher_module.WindowFetcher, "get", reading_get)
    base = z.Pipeline(_source()).tokenize().batch(2).options(canonical_replicas=2, flush_every_k_chunks=2,
                                                             runner="synchronous")
    with base.options(trace_windows=True) as traced, base as plain:
        want = [b["tokens"].tobytes() for b in plain]
        assert read and not any(read)  # not given: the field's default
        read.clear()
        assert [b["tokens"].tobytes() for b in traced] == want and want
        assert read and all(read)
    assert [inspect.signature(f) for f in path] == signatures
