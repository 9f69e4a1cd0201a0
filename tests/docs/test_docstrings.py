"""Every public function, class and method has a docstring; the main user-facing API has an
example. Walks ``zephon_dask.__all__`` and the public names of ``zephon_dask.inspect``,
``zephon_dask.integrations`` (with its framework adapters) and ``zephon_dask.jobs``."""

from __future__ import annotations

import importlib
import inspect

import zephon_dask

MODULES = ("zephon_dask.inspect", "zephon_dask.integrations", "zephon_dask.integrations.hf",
           "zephon_dask.integrations.lightning", "zephon_dask.integrations.accelerate",
           "zephon_dask.integrations.torchtitan", "zephon_dask.jobs")
# the main user-facing API: the docstring shows a short example
WITH_EXAMPLE = {
    "Pipeline", "Dataset", "MixtureWorkSource", "save_state", "load_state", "merge_states",
    "gather_state", "verify_ledgers", "prepare_tokens", "set_log_level", "ZephonTrainer",
    "ZephonDataModule", "prepare_pipeline", "ZephonDataLoader", "configure",
}


def _public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    return list(names) if names is not None else [n for n in vars(module) if not n.startswith("_")]


def _methods(cls):
    """``(qualified name, function)`` of the public methods and properties ``cls`` defines or
    inherits from a zephon_dask class (not those of builtins or third-party bases)."""
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        owner = next((base for base in cls.__mro__ if name in vars(base)), None)
        if owner is None or not owner.__module__.startswith("zephon_dask"):
            continue
        attr = vars(owner)[name]
        if isinstance(attr, staticmethod | classmethod):
            attr = attr.__func__
        if isinstance(attr, property):
            attr = attr.fget
        if inspect.isfunction(attr):
            yield f"{owner.__qualname__}.{name}", attr


def public_api():
    """``(qualified name, object)`` for the whole walked API, each object once."""
    modules = [zephon_dask, *(importlib.import_module(m) for m in MODULES)]
    seen: set[int] = set()
    for module in modules:
        for name in _public_names(module):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or id(obj) in seen:
                continue
            if not obj.__module__.startswith("zephon_dask"):
                continue
            seen.add(id(obj))
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for qualname, method in _methods(obj):
                    if id(method) not in seen:
                        seen.add(id(method))
                        yield qualname, method


def test_every_public_function_and_method_has_a_docstring():
    walked = list(public_api())
    assert len(walked) > 150  # the walk reaches the methods, not only the names
    missing = [name for name, obj in walked if not (obj.__doc__ or "").strip()]
    assert not missing, f"public API without a docstring: {missing}"


def test_the_main_api_shows_examples():
    by_name = {name.rsplit(".", 1)[-1]: obj for name, obj in public_api() if "." in name}
    lacking = []
    for name in sorted(WITH_EXAMPLE):
        obj = by_name[name]
        if "Example" not in (obj.__doc__ or ""):
            lacking.append(name)
        if name == "Pipeline":
            lacking += [q for q, m in _methods(obj) if "Example" not in (m.__doc__ or "")
                        and q.split(".")[-1] not in NO_EXAMPLE]
        if name == "Dataset":
            lacking += [q for q, m in _methods(obj) if q.split(".")[-1].startswith("from_")
                        and "Example" not in (m.__doc__ or "")]
    assert not lacking, f"without an Example: section: {lacking}"


# Pipeline members for internal plumbing that a user rarely calls: a docstring, no example
NO_EXAMPLE = {"session", "spec", "rank", "open_stream", "check_live"}
