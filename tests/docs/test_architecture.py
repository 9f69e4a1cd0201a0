"""The architecture's rules, checked: layers import one way, no module touches another's private
names, options are defined once, the package imports lazily."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zephon_dask as z
from zephon_dask.errors import ConfigError
from zephon_dask.options import BY_NAME, OPTIONS, RUNNER_NAMES, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_layers_import_one_way():
    """The import-linter contracts in pyproject.toml (also run by `make lint`)."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is a dev dependency: pip install -e '.[dev]'"
    out = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in out.stdout


def _private(name: str) -> bool:
    # _repr_html_ and the like are IPython's public protocol, not private names
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def _of_super(node: ast.Attribute) -> bool:
    """``super().<name>``: a base class's attribute, a library's when the name is private (the
    package's own classes call no private method of a base)."""
    call = node.value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "super"


def _defined_private_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def test_no_module_touches_another_modules_private_names():
    """``x._name`` (x not self/cls) and ``from ... import _name`` are allowed only for names the
    same module defines; the package and the tests are both checked."""
    files = sorted((ROOT / "zephon_dask").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    trees = {f: ast.parse(f.read_text(), str(f)) for f in files}
    own = {f: _defined_private_names(t) for f, t in trees.items()}
    ours = set().union(*(names for f, names in own.items() if "zephon_dask" in f.parts))
    found = []
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in ours
                    and node.attr not in own[f]
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{f.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("zephon_dask")):
                found += [f"{f.relative_to(ROOT)}:{node.lineno} import {a.name}"
                          for a in node.names if _private(a.name)]
    assert not found, "private names used outside their module:\n" + "\n".join(found)


# Dask's modules that the package and the tests may import; anything else of dask or distributed
# (dask._expr, distributed.client, distributed.utils_comm, ...) only the adapter may
DASK_ADAPTER = ROOT / "zephon_dask" / "execution" / "dask_compat.py"
DASK_ADAPTER_TESTS = ROOT / "tests" / "cluster" / "test_dask_compat.py"  # checks the internals the adapter relies on
PUBLIC_DASK_MODULES = {"dask", "dask.threaded", "dask.dot", "dask.sizeof", "dask.task_spec", "dask.utils",
                       "distributed", "distributed.comm", "distributed.deploy.spec", "distributed.diagnostics.plugin"}
# what only the adapter does through public names: RPCs through the client's loop, Dask's exit handler,
# the key-name cache
ADAPTER_ONLY_ATTRIBUTES = {"sync", "shutdown_on_close", "cache_clear"}
# public names that begin with an underscore: a named tuple's documented methods
DOCUMENTED_UNDERSCORED = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}


def _dask_module(name: str) -> bool:
    return name.split(".")[0] in ("dask", "distributed")


def test_only_the_dask_adapter_touches_dasks_private_names():
    """Outside ``execution/dask_compat.py`` (and its tests): no internal Dask module imported, no private name
    imported from Dask, no private keyword passed, no other library's private attribute read (in
    the package), and none of the public-looking internals of :data:`ADAPTER_ONLY_ATTRIBUTES`."""
    package = sorted((ROOT / "zephon_dask").rglob("*.py"))
    files = [f for f in package + sorted((ROOT / "tests").rglob("*.py")) if f not in (DASK_ADAPTER, DASK_ADAPTER_TESTS)]
    trees = {f: ast.parse(f.read_text(), str(f)) for f in package + sorted((ROOT / "tests").rglob("*.py"))}
    ours = set().union(*(_defined_private_names(trees[f]) for f in package))
    found = []
    for f in files:
        where, in_package = f.relative_to(ROOT), f in package
        for node in ast.walk(trees[f]):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{where}:{node.lineno} import {m}" for m in modules
                      if _dask_module(m) and m not in PUBLIC_DASK_MODULES]
            if isinstance(node, ast.ImportFrom) and _dask_module(node.module or ""):
                found += [f"{where}:{node.lineno} import {a.name}" for a in node.names if _private(a.name)]
            if isinstance(node, ast.keyword) and node.arg and _private(node.arg) and node.arg not in ours:
                found.append(f"{where}:{node.lineno} {node.arg}=")
            if in_package and isinstance(node, ast.Attribute) and (
                    node.attr in ADAPTER_ONLY_ATTRIBUTES
                    or (_private(node.attr) and _of_super(node))  # overriding a base's private method
                    or (_private(node.attr) and node.attr not in ours and node.attr not in DOCUMENTED_UNDERSCORED
                        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")))):
                found.append(f"{where}:{node.lineno} .{node.attr}")
    assert not found, "Dask's private names outside zephon_dask/execution/dask_compat.py:\n" + "\n".join(found)


FRAMEWORKS_ADAPTER = ROOT / "zephon_dask" / "pipeline" / "frameworks_compat.py"
# the training frameworks' internals the package relies on: classes recognised on the call stack and
# Lightning's loop attributes and progress counters
FRAMEWORK_INTERNALS = {"_FitLoop", "_TrainingEpochLoop", "_EvaluationLoop", "DataLoaderShard", "IterableDatasetShard",
                       "DataLoaderDispatcher", "fit_loop", "epoch_loop", "batch_progress", "optim_progress"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def test_only_the_frameworks_adapter_names_their_internals():
    """Outside ``pipeline/frameworks_compat.py`` no code (docstrings and comments aside) names a
    framework's internal class or counter, as an attribute or in a string."""
    found = []
    for f in sorted((ROOT / "zephon_dask").rglob("*.py")):
        if f == FRAMEWORKS_ADAPTER:
            continue
        tree = ast.parse(f.read_text(), str(f))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in FRAMEWORK_INTERNALS:
                found.append(f"{f.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and any(name in node.value for name in FRAMEWORK_INTERNALS)):
                found.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.value[:60]!r}")
    assert not found, "frameworks' internals outside zephon_dask/pipeline/frameworks_compat.py:\n" + "\n".join(found)


def test_the_docs_options_table_is_the_definition():
    text = (ROOT / "docs" / "execution.md").read_text()
    assert markdown_table() in text, "the options table is stale: run `make docs`"


def test_every_runner_offered_is_registered():
    from zephon_dask.commands import run
    from zephon_dask.execution import RUNNERS, Runner

    assert tuple(RUNNERS) == RUNNER_NAMES == BY_NAME["runner"].choices
    assert all(issubclass(cls, Runner) and cls.name == name for name, cls in RUNNERS.items())
    parser = __import__("argparse").ArgumentParser()
    run.add_arguments(parser)
    runner = next(a for a in parser._actions if a.dest == "runner")
    assert tuple(runner.choices) == RUNNER_NAMES


def test_options_signature_lists_every_option():
    import inspect

    params = inspect.signature(z.Pipeline.options).parameters
    assert [p for p in params if p != "self"] == [o.name for o in OPTIONS]


@pytest.mark.parametrize("name,bad", [("fuse", 1), ("deterministic", "yes"), ("ledger", 5), ("ledger", ""),
                                      ("address", 8786), ("client", "tcp://x:1"), ("dashboard_address", 0),
                                      ("retries", -1), ("runner", "ray"), ("stall_timeout", 0)])
def test_every_option_is_validated(name, bad):
    ws = z.MixtureWorkSource([z.Dataset.from_records("d", ["a"])], chunk_size=1)
    with pytest.raises(ConfigError, match=name):
        z.Pipeline(ws).options(**{name: bad})


def test_the_facade_keeps_building_and_identity():
    """``Pipeline`` has at most 30 public attributes (docs/architecture.md, the facade): iteration,
    resume, the DP identity, the step shape, step counts, the lane table and windows live in their
    own homes (the session, ``inspect``). A new attribute that is not building or identity moves
    there too."""
    public = [n for n in dir(z.Pipeline) if not n.startswith("_")]
    assert len(public) <= 30, public


def test_builder_methods_return_new_pipelines():
    ws = z.MixtureWorkSource([z.Dataset.from_records("d", ["a b c", "d e"])], chunk_size=1)
    base = z.Pipeline(ws).tokenize("bytes")
    a, b = base.pack(8), base.pack(16)  # side by side: neither "already packs"
    assert a is not base and b is not base and base.description.accumulators == ()
    assert a.fingerprint() != b.fingerprint() != base.fingerprint()
    fast = a.options(runner="synchronous")
    assert a.description.settings["runner"] == "distributed" and fast.description.settings["runner"] == "synchronous"
    assert fast.fingerprint() == a.fingerprint()


def test_a_derived_pipeline_keeps_the_loaded_state():
    ws = z.MixtureWorkSource([z.Dataset.from_records("d", [f"doc {i}" for i in range(40)])], chunk_size=2)
    p = z.Pipeline(ws).tokenize("bytes").pack(4).batch(2).options(runner="synchronous", canonical_replicas=2)
    with p:
        it = iter(p)
        first = [next(it)["tokens"].tobytes() for _ in range(3)]
        state = p.state_dict()
        rest = [next(it)["tokens"].tobytes() for _ in range(3)]
    q = p.options(runner="synchronous").load_state_dict(state)
    threads = q.options(runner="threads", n_workers=2)  # execution changed: the resume point stays
    with threads:
        assert [b["tokens"].tobytes() for b, _ in zip(threads, range(3))] == rest
    assert first
    with pytest.raises(z.StateError, match="different data configuration"):
        q.options(flush_every_k_chunks=3)  # data changed: the state no longer describes it


def test_importing_the_package_loads_nothing_heavy():
    code = ("import sys, zephon_dask, zephon_dask.errors, zephon_dask.options, zephon_dask.cli; "
            "print(sorted(m for m in ('numpy', 'dask', 'distributed', 'torch', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


PARAMETER_SCOPE = ("zephon_dask/consumer", "zephon_dask/execution", "zephon_dask/pipeline/session.py")
MOST_PARAMETERS = 8  # past this, settings travel as one object (ConsumerSettings, ClusterSettings)


def _scope_files(*paths: str) -> list[Path]:
    files: list[Path] = []
    for path in map(ROOT.joinpath, paths):
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_no_function_in_the_consumer_the_runners_or_the_session_takes_more_than_8_parameters():
    """Named parameters, ``self`` and ``cls`` not counted."""
    found = []
    for f in _scope_files(*PARAMETER_SCOPE):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]
                if len(names) > MOST_PARAMETERS:
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}() takes {len(names)}")
    assert not found, "pass a settings object instead:\n" + "\n".join(found)


def _execution_imports(f: Path) -> set[str]:
    """The modules of ``zephon_dask.execution`` that ``f`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zephon_dask.execution."):
            found.add(node.module.split(".")[2])
    return found


def test_the_execution_modules_are_small_and_import_in_no_circle():
    modules = {f.stem: f for f in (ROOT / "zephon_dask" / "execution").glob("*.py")}
    sizes = {name: len(f.read_text().splitlines()) for name, f in modules.items()}
    assert max(sizes.values()) <= 500, sizes
    graph = {name: _execution_imports(f) & set(modules) - {name} for name, f in modules.items()}
    assert not graph["plugins"] & {"cluster", "runner", "handle", "head_start"}, graph["plugins"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and not seen.add(nxt) and reaches(nxt, goal, seen))
                   for nxt in graph[start])

    circles = sorted(name for name in graph if reaches(name, name, set()))
    assert not circles, {name: graph[name] for name in circles}
