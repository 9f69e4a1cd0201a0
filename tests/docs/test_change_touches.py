"""docs/architecture.md's "What a change touches", checked: a record operator, a file format and a
checkpoint field are made in a copy of the repository as a contributor would (:class:`Checkout`),
shown to work, and the files written (by hand and by ``make docs``) are those the table names, at
most three by hand. A new runner and a new data option are defined here, in the test, and work
with nothing else edited (operators and runners say what they can do as class attributes, not by
their type or name)."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

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


# -- changes made in a copy of the repository, their files counted ----------------------------

ROOT = Path(__file__).resolve().parents[2]
MOST_BY_HAND = 3


def documented(change: str) -> tuple[list[str], list[str]]:
    """The files docs/architecture.md's table names for ``change``: (written by hand, rewritten by
    ``make docs``), as glob patterns (``<name>`` is any name)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## What a change touches", 1)[1]
    row = next((line for line in text.splitlines() if line.startswith(f"| {change} |")), None)
    assert row is not None, f"docs/architecture.md has no row for {change!r}"
    cells = [cell.strip() for cell in row.strip("|").split(" | ")]

    def paths(cell: str) -> list[str]:
        while re.search(r"\([^()]*\)", cell):
            cell = re.sub(r"\([^()]*\)", "", cell)  # what a parenthesis says is not a file written
        found = re.findall(r"`([^`]+\.(?:py|md|toml))`", cell)
        return [re.sub(r"<[^>]+>", "*", f) for f in found]

    return paths(cells[1]), paths(cells[2])


def every_documented_change() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text().split("## What a change touches", 1)[1]
    return [line.split(" | ")[0].lstrip("| ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| change |", "| ---"))]


class Checkout:
    """A copy of the repository (package, docs, tests, examples) where a change is made as a
    contributor would: :meth:`write` and :meth:`edit` record the files written by hand,
    :meth:`make_docs` the pages ``make docs`` rewrites; :meth:`run` and :meth:`pytest` run the
    copy's own code and tests."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "repo"
        for part in ("zephon_dask", "docs", "tests", "examples"):
            shutil.copytree(ROOT / part, self.root / part, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "Makefile"):
            shutil.copy(ROOT / name, self.root / name)
        self.by_hand: set[str] = set()
        self.generated: set[str] = set()

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        self.by_hand.add(rel)

    def append(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.write_text(path.read_text() + textwrap.dedent(text))
        self.by_hand.add(rel)

    def edit(self, rel: str, *replacements: tuple[str, str]) -> None:
        path = self.root / rel
        text = path.read_text()
        for old, new in replacements:
            assert text.count(old) == 1, f"{rel}: {old!r} is not there once"
            text = text.replace(old, new)
        path.write_text(text)
        self.by_hand.add(rel)

    def _env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.root)}

    def make_docs(self) -> None:
        """``make docs``'s command, in the copy; the pages it rewrote are recorded."""
        before = {p: p.read_text() for p in (self.root / "docs").glob("*.md")}
        subprocess.run([sys.executable, "docs/tables.py"], cwd=self.root, env=self._env(), check=True,
                       timeout=300, capture_output=True)
        self.generated |= {str(p.relative_to(self.root)) for p, text in before.items() if p.read_text() != text}

    def run(self, code: str) -> str:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=self.root, env=self._env(),
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    def pytest(self, *args: str) -> None:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                             cwd=self.root, env=self._env(), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]

    def check_against(self, change: str) -> None:
        """The files written are those docs/architecture.md names for ``change``, at most three by hand."""
        by_hand, generated = documented(change)
        assert len(self.by_hand) <= MOST_BY_HAND, sorted(self.by_hand)
        for written, patterns in ((self.by_hand, by_hand), (self.generated, generated)):
            assert all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in written), (sorted(written), patterns)
            assert all(any(fnmatch.fnmatch(f, p) for f in written) for p in patterns), (sorted(written), patterns)


def test_every_documented_change_is_at_most_three_files_by_hand():
    changes = every_documented_change()
    assert {"a record operator", "a file format", "a checkpoint field", "an execution or step option"} <= set(changes)
    for change in changes:
        by_hand, _ = documented(change)
        assert 1 <= len(by_hand) <= MOST_BY_HAND, (change, by_hand)


def test_a_record_operator_is_its_module_and_its_docs(tmp_path):
    """The operator's class in its own module and a section of docs/operators.md; it enters a
    pipeline by the public ``Pipeline.add_op`` (until that exists on this branch, the spec's
    record operators: what ``add_op`` will do), with exact step counts and its fingerprint."""
    repo = Checkout(tmp_path)
    repo.write("zephon_dask/operators/upper.py", '''
        """``Upper``: upper-case a record's text. Pure."""

        from __future__ import annotations

        from .base import RecordOp


        class Upper(RecordOp):
            """Upper-case ``record[field]``; every row stays one sample.

            Example:
                >>> pipeline.add_op(Upper())  # doctest: +SKIP
            """

            name = "upper"
            one_to_one = True

            def __init__(self, field: str = "text"):
                self.field = field

            def apply(self, record: dict) -> list[dict]:
                """The record with its text upper-cased."""
                return [{**record, self.field: record[self.field].upper()}]

            def spec(self) -> dict:
                """What defines it in the fingerprint."""
                return {"op": self.name, "field": self.field}
        ''')
    repo.append("docs/operators.md", """

        ## Upper-case text: `Upper`

        `pipeline.add_op(Upper(field="text"))` upper-cases each record's text; every row stays one sample.
        """)
    out = repo.run("""
        import dataclasses
        import zephon_dask as z
        from zephon_dask.core import compute_window
        from zephon_dask.inspect import counting
        from zephon_dask.operators.upper import Upper

        ws = z.MixtureWorkSource([z.Dataset.from_records("d", [f"doc {i}" for i in range(16)])], chunk_size=2)
        base = z.Pipeline(ws).tokenize("bytes").batch(1).options(canonical_replicas=2, runner="synchronous")
        if hasattr(z.Pipeline, "add_op"):
            spec = z.Pipeline(ws).add_op(Upper()).tokenize("bytes").batch(1).options(canonical_replicas=2).spec
        else:  # what add_op does: the operator before the tokenizer in the spec's record operators
            spec = dataclasses.replace(base.spec, record_ops=(Upper(), *base.spec.record_ops))
        window = compute_window(spec, 0, 0)
        text = bytes(t for t in window.table.tokens.tolist() if t < 256).decode()
        assert "DOC" in text and "doc" not in text, text
        assert counting.known_rows(spec) is not None and spec.fingerprint != base.spec.fingerprint
        print("ok")
        """)
    assert out.strip() == "ok"
    repo.make_docs()
    repo.pytest("tests/docs/test_generated_tables.py", "tests/docs/test_docstrings.py",
                "tests/docs/test_architecture.py", "-k", "private or facade or generated or docstring")
    repo.check_against("a record operator")


def test_a_plain_text_format_is_its_module_and_its_docs(tmp_path):
    """A folder of ``.txt`` files, one record a line: a module defining ``READER`` (no
    constructor), a section of docs/formats.md, and ``make docs`` for the tables that list formats."""
    repo = Checkout(tmp_path)
    repo.write("zephon_dask/data/lines.py", '''
        """Plain text, one record per line (``.txt``). Pure."""

        from __future__ import annotations

        from .reader import Reader


        def inspect(fs, file) -> dict:
            """The file's line count."""
            return {"num_samples": len(fs.cat_file(file.name).decode().splitlines())}


        def read(dataset, index: int, offsets) -> list[dict]:
            """The lines at ``offsets`` of shard ``index``."""
            with open(dataset.shards[index].path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            return [{dataset.text_field: lines[i]} for i in offsets.tolist()]


        READER = Reader("lines", None, read, inspect=inspect, extensions=(".txt",),
                        doc="plain text, one record per line (`.txt`)")
        ''')
    repo.append("docs/formats.md", """

        ## Plain text (`format = "lines"`)

        Each line of a `.txt` file is one record, its text in `text_field`.
        """)
    repo.make_docs()
    out = repo.run("""
        import pathlib, tempfile
        from zephon_dask import Dataset
        from zephon_dask.recipe import load_recipe

        root = pathlib.Path(tempfile.mkdtemp())
        (root / "data").mkdir()
        (root / "data" / "a.txt").write_text("one\\ntwo\\nthree\\n")
        (root / "data" / "b.txt").write_text("four\\n")
        found = Dataset.from_path("l", root / "data", progress=False)
        named = Dataset.from_files("l", root / "data", "lines", progress=False)
        assert found.format == named.format == "lines" and found.shard_sizes == (3, 1)
        assert found.read(0, [2, 0]) == [{"text": "three"}, {"text": "one"}]
        (root / "r.toml").write_text('[[datasets]]\\nname = "l"\\npath = "data"\\nformat = "lines"\\n'
                                     '[batch]\\nmicrobatch_size = 1\\n')
        (entry,) = load_recipe(root / "r.toml").datasets
        assert entry.open().shard_sizes == (3, 1)
        print("ok")
        """)
    assert out.strip() == "ok"
    repo.pytest("tests/docs/test_generated_tables.py", "tests/unit/test_recipe.py", "tests/formats/test_formats_discovery.py",
                "tests/formats/test_data.py", "-k", "generated or reference or registry or new_format or chosen_files "
                "or others_warned or missing_paths")
    repo.check_against("a file format")


def test_a_checkpoint_field_is_the_schema_its_writer_and_its_reader(tmp_path):
    """``StepProgress.samples_per_step``: the field, its check, version 3 and its migration in
    the schema; written by ``Progress``; read by the resume checks. Older checkpoints (the
    committed version 1 state and version 2 loader states) still resume."""
    repo = Checkout(tmp_path)
    repo.edit("zephon_dask/state/schema.py",
              ("VERSION = 2\n", "VERSION = 3\n"),
              ("    microbatch_size: int\n", "    microbatch_size: int\n    samples_per_step: int\n"),
              ("STEP_FIELDS_V1 = STEP_FIELDS[:4]", "STEP_FIELDS_V1 = STEP_FIELDS[:4]\nSTEP_FIELDS_V2 = STEP_FIELDS[:6]"),
              ("    names = STEP_FIELDS if version >= 2 else STEP_FIELDS_V1\n",
               "    names = STEP_FIELDS if version >= 3 else STEP_FIELDS_V2 if version == 2 else STEP_FIELDS_V1\n"),
              ("MIGRATIONS = {1: _migrate_v1}", '''def _migrate_v2(state: dict) -> dict:
    """v2 -> v3: record the samples per global step."""
    out = copy.deepcopy(state)
    out["step"]["samples_per_step"] = out["step"]["global_batches"] * out["step"]["microbatch_size"]
    out["version"] = 3
    return out


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2}'''))
    repo.edit("zephon_dask/state/progress.py",
              ("microbatch_size=shape.microbatch),",
               "microbatch_size=shape.microbatch,\n"
               "                              samples_per_step=shape.global_batches * shape.microbatch),"))
    repo.edit("zephon_dask/pipeline/resume.py",
              ("    _check_replicas(state, d.settings[\"canonical_replicas\"])\n",
               "    _check_replicas(state, d.settings[\"canonical_replicas\"])\n"
               "    step = state.step  # a worker state recounted from version 2 has no microbatch size (0)\n"
               "    if step.microbatch_size and step.samples_per_step != step.global_batches * step.microbatch_size:\n"
               "        raise StateError(\"the checkpoint's samples per step disagree with its G and microbatch\")\n"))
    out = repo.run("""
        import zephon_dask as z
        from zephon_dask.state import VERSION

        ws = z.MixtureWorkSource([z.Dataset.from_records("d", [f"doc {i}" for i in range(16)])], chunk_size=2)
        make = lambda: z.Pipeline(ws).tokenize("bytes").batch(2).options(canonical_replicas=2, runner="synchronous")
        with make() as p:
            it = iter(p)
            [next(it) for _ in range(3)]
            state = p.state_dict()
            rest = [next(it)["tokens"].tobytes() for _ in range(3)]
        assert VERSION == 3 and state["version"] == 3 and state["step"]["samples_per_step"] == 2 * 2
        with make().load_state_dict(state) as q:
            assert [b["tokens"].tobytes() for b, _ in zip(q, range(3))] == rest
        print("ok")
        """)
    assert out.strip() == "ok"
    repo.make_docs()
    repo.pytest("tests/pipeline/test_state_schema.py", "tests/unit/test_step_contract.py",
                "tests/pipeline/test_stateful_loader.py", "tests/pipeline/test_state.py",
                "-k", "malformed or v1 or resume_derives or previous_format or json or migrat")
    repo.check_against("a checkpoint field")


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
