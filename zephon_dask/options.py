"""Every ``Pipeline.options`` setting, defined once. Pure; light to import (no numpy, dask, torch).

Each :class:`Option` says its default, whether it is a *data* setting (part
of the fingerprint: it decides which samples exist and where), a *step*
setting (the global step, recorded in checkpoints and kept on resume) or an
*execution* setting (never changes a byte), the TOML types a recipe may give
it, its choices and a one-line doc. ``Pipeline.options`` validates with
:func:`check`, the recipe loader types ``[options]`` with
:attr:`Option.toml`, the CLI takes its choices from :data:`OPTIONS`, and the
table in ``docs/execution.md`` is :func:`markdown_table` (a test compares
them).

Checks here concern one value at a time; checks across settings (a global
step against ``canonical_replicas``, a DP group against its degree) belong to
the layers that own those rules and run when the pipeline uses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .validate import check_bool, check_choice, check_int, check_seconds, did_you_mean

RUNNER_NAMES = ("distributed", "threads", "synchronous")  # the execution registry's keys (tested)
MAPPING_STRATEGIES = ("contiguous", "interleaved")


# Validators: ``(value, option name) -> value``, raising ConfigError naming both.
def _positive(hint: str = "") -> Callable[[Any, str], Any]:
    return lambda v, name: check_int(v, name, 1, hint=hint)


def _optional_positive(v: Any, name: str) -> Any:
    return check_int(v, name, 1, optional=True)


def _count(v: Any, name: str) -> Any:
    return check_int(v, name, 0)


def _optional_count(v: Any, name: str) -> Any:
    return check_int(v, name, 0, optional=True)


def _choice(choices: tuple[str, ...]) -> Callable[[Any, str], Any]:
    return lambda v, name: check_choice(v, choices, name)


def _seconds(hint: str) -> Callable[[Any, str], Any]:
    return lambda v, name: check_seconds(v, name, hint)


def _optional_str(example: str) -> Callable[[Any, str], Any]:
    def check(value: Any, name: str) -> Any:
        if value is None or (isinstance(value, str) and value):
            return value
        raise ConfigError(f"{name}={value!r} must be a non-empty string or None, e.g. {example}")
    return check


def _optional_path(value: Any, name: str) -> Any:
    if value is None or (isinstance(value, str) and value) or isinstance(value, os.PathLike):
        return value
    raise ConfigError(f"{name}={value!r} must be a folder path or None")


def _client(value: Any, name: str) -> Any:
    if value is None or hasattr(value, "submit") and hasattr(value, "scheduler"):
        return value
    raise ConfigError(f"{name}={value!r} must be a dask.distributed Client or None; to reach a "
                      "scheduler by address, use address='tcp://host:8786'")


@dataclass(frozen=True)
class Option:
    """One setting: ``name``, ``default``, ``kind`` (``"data"`` or ``"execution"``), the TOML
    types a recipe may use (``None``: not settable in a recipe), ``choices`` and ``doc``."""

    name: str
    default: Any
    kind: str
    toml: tuple[type, ...] | None
    doc: str
    validate: Callable[[Any, str], Any]
    choices: tuple[str, ...] = ()

    def check(self, value: Any) -> Any:
        """``value`` validated (ints normalised to ``int``), or a :class:`ConfigError`."""
        return self.validate(value, self.name)


_INT, _BOOL, _STR, _NUMBER = (int,), (bool,), (str,), (int, float)

OPTIONS: tuple[Option, ...] = (
    Option("canonical_replicas", 8, "data", _INT,
           "R, the fixed number of logical lanes; fixed for a run's lifetime",
           _positive("size it for the largest data-parallel degree you expect, e.g. 8")),
    Option("flush_every_k_chunks", 8, "data", _INT,
           "chunks per lane window; accumulators start empty and flush at each window's end",
           _positive("e.g. 8")),
    Option("drop_last_step", True, "data", _BOOL,
           "a finite stream's pass ends on a whole global step: the batches after its last whole step "
           "are dropped (False: every sample is kept and the pass's last step may hold fewer batches)",
           check_bool),
    Option("batches_per_step", None, "step", _INT,
           "batches per rank in one global step (G = n x dp_degree); see docs/checkpointing.md",
           _optional_positive),
    Option("global_batches_per_step", None, "step", _INT,
           "G, batches in one global step over all ranks, a multiple of canonical_replicas (default R)",
           _optional_positive),
    Option("runner", "distributed", "execution", _STR,
           "where windows compute: a Dask cluster, a thread pool, or on demand in this thread",
           _choice(RUNNER_NAMES), RUNNER_NAMES),
    Option("n_workers", None, "execution", _INT,
           "workers of the embedded LocalCluster or threads of the threads runner (default: one per core)",
           _optional_positive),
    Option("threads_per_worker", 1, "execution", _INT,
           "threads per embedded Dask worker",
           _positive()),
    Option("client", None, "execution", None,
           "an existing dask.distributed Client to run on (left running; not in recipes)",
           _client),
    Option("address", None, "execution", _STR,
           "the address of a running Dask scheduler to connect to (left running)",
           _optional_str("'tcp://10.0.0.5:8786'")),
    Option("session_client", True, "execution", _BOOL,
           "use the Dask client this process made current, when there is one",
           check_bool),
    Option("prefetch_windows", None, "execution", _INT,
           "windows kept in flight (default: 2 per worker thread + 4; on a shared cluster, per thread of the group's share)",
           _optional_positive),
    Option("prefetch_bytes", None, "execution", _INT,
           "bytes of windows kept in flight, beside prefetch_windows: at most this many bytes' worth "
           "at the mean size of the windows taken so far, at least one window (default: no bound)",
           _optional_positive),
    Option("fuse", True, "execution", _BOOL,
           "one task per window, the first windows of an iteration (one per lane, for as many lanes as "
           "worker threads) and its last ones (as many as worker threads, when every lane ends) split "
           "into chunk tasks (True), or a task per chunk plus one per window throughout (False)",
           check_bool),
    Option("windows_per_task", None, "execution", _INT,
           "fused windows computed by one Dask task, consecutive in the order they are needed (None: "
           "automatic, 1 for the first 4 windows, then as many as keep Dask's CPU per task under a "
           "quarter of a window's CPU, at most 8, the default prefetch scaled alike; in-process runners: 1)",
           _optional_positive),
    Option("head_start", True, "execution", _BOOL,
           "while the embedded cluster starts, or a lost scheduler is away, compute the windows "
           "needed in this process (False: every window on the cluster)",
           check_bool),
    Option("retries", 2, "execution", _INT,
           "times Dask reruns a failed task before the error reaches the iterator",
           _count),
    Option("dp_degree", None, "execution", _INT,
           "data-parallel degree (default: torch.distributed's world size, else 1)",
           _optional_positive),
    Option("dp_group_id", None, "execution", _INT,
           "this DP group (default: torch.distributed's rank, else 0)",
           _optional_count),
    Option("mapping_strategy", "contiguous", "execution", _STR,
           "how lanes are grouped onto DP groups",
           _choice(MAPPING_STRATEGIES), MAPPING_STRATEGIES),
    Option("deterministic", True, "execution", _BOOL,
           "strict round-robin over lanes (False: whichever lane is ready first; changes the order)",
           check_bool),
    Option("ledger", None, "execution", _STR,
           "a folder for one JSON line per delivered batch (rank-<n>.jsonl)",
           _optional_path),
    Option("cluster_timeout", 45.0, "execution", _NUMBER,
           "seconds without scheduler or worker before a wait fails with ClusterStallError",
           _seconds("e.g. 45")),
    Option("stall_timeout", 30.0, "execution", _NUMBER,
           "seconds a window may compute before it is reported and computed again elsewhere",
           _seconds("e.g. 30")),
    Option("dashboard_address", "127.0.0.1:0", "execution", _STR,
           "where the embedded cluster serves its dashboard (None: no dashboard)",
           _optional_str("'127.0.0.1:8787'")),
)

BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}
DEFAULTS: Mapping[str, Any] = {o.name: o.default for o in OPTIONS}
DATA_OPTIONS = tuple(o.name for o in OPTIONS if o.kind == "data")


def unknown(name: str) -> ConfigError:
    """The error for an option that does not exist, with the closest known name."""
    return ConfigError(f"unknown option {name!r}; {did_you_mean(name, BY_NAME)}known: {', '.join(sorted(BY_NAME))}")


def check(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` validated one by one, in name order (the first bad one raises)."""
    out = {}
    for name in sorted(values):
        if name not in BY_NAME:
            raise unknown(name)
        out[name] = BY_NAME[name].check(values[name])
    return out


def markdown_table() -> str:
    """The options as the Markdown table of ``docs/execution.md``."""
    names = {int: "integer", float: "number", bool: "bool", str: "string"}
    rows = ["| option | kind | recipe type | default | what it sets |", "| --- | --- | --- | --- | --- |"]
    for o in OPTIONS:
        default = "none" if o.default is None else f"`{o.default!r}`"
        toml = " or ".join(names[t] for t in o.toml) if o.toml else "not in recipes"
        choices = f" (one of {', '.join(map(repr, o.choices))})" if o.choices else ""
        rows.append(f"| `{o.name}` | {o.kind} | {toml} | {default} | {o.doc}{choices} |")
    return "\n".join(rows)
