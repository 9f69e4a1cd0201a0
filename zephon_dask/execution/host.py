"""The embedded cluster's host: one process from which its scheduler and its workers are forked.

Starting a process for each of the scheduler and the workers means a fresh interpreter importing
``distributed`` (and numpy, tokenizers and this package) each time, several at once, on the cores
the head start computes the first windows with. The host is started once, as the cluster's
start begins: a fresh interpreter, in a session of its own, which imports :data:`PRELOAD` once
and then serves as a private fork server (the protocol of Python's ``multiprocessing``
forkserver, with an instance of our own: this process's ``multiprocessing``, and any forkserver
the training script uses, are untouched). Every process of the cluster is forked from it, from a
process with one thread (the imports start none; :func:`serve` warns if one did).

What the processes forked from it inherit, the host owns: its environment is set when it starts
(this process's, plus the worker environment: what acts only at a process's start, such as glibc's
``MALLOC_*`` settings and ``PYTHONHASHSEED``, must be there), with ``PYTHONPATH`` this process's
``sys.path`` and this process's Dask config (``INHERIT_CONFIG_ENV``); this process's own
``os.environ`` is never changed. A process it forks never imports the training script
(``__main__``), also when a nanny restarts its worker.

Its lifelines: the host ends when this process and every process forked from it are gone (each
holds the write end of its ``alive`` pipe, as with Python's forkserver) or when :meth:`Host.close`
stops it; a process forked from it can watch :func:`training_process_gone`. Its socket lives in
a private temporary directory (mode 0700), removed when the host ends.

Module state: none. A :class:`Host` holds its process, its socket's address and the write end of
its ``alive`` pipe.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver as forkserver
import multiprocessing.popen_forkserver as popen_forkserver
import multiprocessing.reduction as reduction
import multiprocessing.spawn as spawn
import multiprocessing.util as util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator

from ..errors import ClusterError

# what the scheduler and a worker import: imported once, in the host, before it forks any (and
# the modules of their HTTP routes, ROUTES); what each imported after its fork was ~25 ms of CPU
PRELOAD = ("distributed", "zephon_dask.execution.spawned", "zephon_dask.execution.runner",
           "zephon_dask.execution.plugins", "zephon_dask.graph", "zephon_dask.operators.pack",
           "zephon_dask.operators.shuffle", "tokenizers", "multiprocessing.synchronize", "tornado.platform.asyncio")
# the Dask config keys naming the modules of the scheduler's and the workers' HTTP routes
ROUTES = ("distributed.scheduler.http.routes", "distributed.worker.http.routes")
# the preparation data that would make a forked process import the training script
MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


class HostPopen(popen_forkserver.Popen):
    """A process forked by ``host`` (Python's forkserver ``Popen``, asking our host), told to
    import no ``__main__``."""

    _fds: list[int]  # the file descriptors the child gets (Python's forkserver Popen sets it)

    def __init__(self, process_obj, host: Host):
        self.host = host
        super().__init__(process_obj)

    def _launch(self, process_obj) -> None:
        prep_data = spawn.get_preparation_data(process_obj.name)
        for key in MAIN_KEYS:  # distributed pickles what __main__ defines by value
            prep_data.pop(key, None)
        buf = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        self.sentinel, w = self.host.connect(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of this process: it reads EOF once we are gone
        self.finalizer = util.Finalize(self, close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class HostProcess(multiprocessing.context.ForkServerProcess):
    """A ``multiprocessing`` process forked by the host it was made by (:meth:`HostContext.Process`)."""

    host: Host | None = None

    @staticmethod
    def _Popen(process_obj):  # noqa: N802  (multiprocessing's name)
        return HostPopen(process_obj, process_obj.host)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "host"}  # the child needs no host


class HostContext(multiprocessing.context.ForkServerContext):
    """A ``multiprocessing`` context whose processes are forked by ``host``."""

    def __init__(self, host: Host):
        self.host = host

    def Process(self, *args, **kwargs) -> HostProcess:  # type: ignore[override]  # noqa: N802  (multiprocessing's name)
        process = HostProcess(*args, **kwargs)
        process.host = self.host
        return process


class Host:
    """Start the host: ``python -c`` :func:`serve` with environment ``env``, in a session of its
    own, its stdin closed, its stdout and stderr this process's. It imports at once; a process
    asked of it before it is ready is forked once it is. Holds the process."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD):
        self.directory = tempfile.mkdtemp(prefix="zephon-dask-host-")  # mode 0700: ours alone may connect
        self.address = os.path.join(self.directory, "socket")
        alive_r, alive_w = os.pipe()
        self._alive_w: int | None = alive_w
        self.stopped = False  # set by close() and stop(): a process asked of it meanwhile is not an error
        try:
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(self.address)
                listener.listen()
                code = (f"from zephon_dask.execution.host import serve; "
                        f"serve({listener.fileno()}, {alive_r}, {preload!r}, {self.directory!r})")
                # -P: its sys.path is env's PYTHONPATH (the training process's), not the working directory first
                self.process = subprocess.Popen([sys.executable, "-P", "-c", code], env=env, stdin=subprocess.DEVNULL,
                                                pass_fds=(listener.fileno(), alive_r), start_new_session=True)
        except BaseException:
            os.close(alive_w)
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        finally:
            os.close(alive_r)
        self._server = forkserver.ForkServer()  # Python's client side of the protocol, pointed at our host
        vars(self._server).update({"_forkserver_address": self.address, "_forkserver_alive_fd": alive_w,
                                   "_forkserver_pid": self.process.pid})
        self.context = HostContext(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def connect(self, fds: list[int]) -> tuple[int, int]:
        """Ask the host for a process (Python's forkserver protocol): ``(sentinel, data pipe)``."""
        if self._alive_w is None:
            raise ClusterError("the embedded cluster's host is closed")  # an OSError, as the protocol's own
        return self._server.connect_to_new_process(fds)

    def close(self, timeout: float) -> None:
        """Stop the host (``SIGTERM``; ``SIGKILL`` after ``timeout`` seconds); the processes it
        forked are not its to stop. Idempotent."""
        self.stopped = True
        alive_w, self._alive_w = self._alive_w, None
        if alive_w is not None:
            os.close(alive_w)
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout)
        shutil.rmtree(self.directory, ignore_errors=True)

    def stop(self) -> None:
        """Ask the host to stop (``SIGTERM``) and remove its socket, waiting for nothing (at
        interpreter exit)."""
        self.stopped = True
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.process.pid, signal.SIGTERM)
        shutil.rmtree(self.directory, ignore_errors=True)


def close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def thread_count() -> int:
    """This process's threads (native ones included, where ``/proc`` says; else Python's)."""
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/task"))
    import threading

    return threading.active_count()


@contextlib.contextmanager
def libyaml_loads() -> Iterator[None]:
    """``yaml.safe_load`` with libyaml's parser, where PyYAML has it, while the host imports:
    ``distributed`` reads its config file with it (~30 ms of the host's CPU in Python's parser).
    The resolver and the constructor stay PyYAML's safe ones, so the values are the same; the
    processes forked afterwards get ``yaml.safe_load`` back."""
    try:
        import yaml  # type: ignore[import-untyped]  # (a dependency of dask; no stubs installed)
    except ImportError:
        yield
        return
    loader = getattr(yaml, "CSafeLoader", None)
    if loader is None:
        yield
        return
    safe_load = yaml.safe_load
    yaml.safe_load = functools.partial(yaml.load, Loader=loader)
    try:
        yield
    finally:
        yaml.safe_load = safe_load


def route_modules() -> list[str]:
    """The modules of the scheduler's and the workers' HTTP routes (:data:`ROUTES`), from this
    process's Dask config."""
    import dask

    return [name for key in ROUTES for name in dask.config.get(key, None) or ()]


def abandoned_before_start(value: BaseException) -> bool:
    """Whether ``value`` ended a forked process while it read what its requester sent it (in
    ``multiprocessing.spawn._main``, before the process's target ran) because the requester had
    released it meanwhile: a semaphore already unlinked (``FileNotFoundError``), the data pipe
    closed early (``EOFError``). The training process exiting, or its cluster closing, while a
    worker is being made does that: no one waits for that process."""
    if not isinstance(value, (FileNotFoundError, EOFError)):
        return False
    frames = traceback.extract_tb(value.__traceback__)
    return any(f.name == "_main" and os.path.basename(f.filename) == "spawn.py" for f in frames)


def quiet_if_abandoned(kind: type[BaseException], value: BaseException, tb) -> None:
    """``sys.excepthook`` of the host and the processes it forks: a process abandoned before its
    start (:func:`abandoned_before_start`) ends without a traceback; any other error is printed as
    Python prints it."""
    if not abandoned_before_start(value):
        sys.__excepthook__(kind, value, tb)


def serve(listener_fd: int, alive_r: int, preload: tuple[str, ...], directory: str) -> None:
    """The host's process: import ``preload``, then fork a process for each request on
    ``listener_fd`` (Python's forkserver loop) until every holder of ``alive_r``'s write end is
    gone; then remove ``directory`` (its socket). ``SIGTERM`` keeps its default (the processes
    forked inherit this process's handlers, and its ``sys.excepthook``, :func:`quiet_if_abandoned`)."""
    sys.excepthook = quiet_if_abandoned
    try:
        with libyaml_loads():
            for name in preload:
                with contextlib.suppress(ImportError):  # an optional module (tokenizers)
                    importlib.import_module(name)
        for name in route_modules():
            with contextlib.suppress(ImportError):  # a route Dask itself reports, when its server starts
                importlib.import_module(name)
        threads = thread_count()
        if threads > 1:
            print(f"zephon_dask: the embedded cluster's host has {threads} threads after its imports; "
                  "forking from it copies their locks in whatever state they are", file=sys.stderr)
        forkserver.main(listener_fd, alive_r, [])
    finally:
        if os.getpid() == PID_AT_IMPORT:  # the host itself, never a process forked from it
            shutil.rmtree(directory, ignore_errors=True)


PID_AT_IMPORT = os.getpid()


def training_process_gone() -> int | None:
    """In a process forked by a host: a file descriptor that reads EOF once the process that asked
    for it is gone (``multiprocessing``'s parent sentinel); ``None`` elsewhere."""
    parent = multiprocessing.parent_process()
    return parent.sentinel if parent is not None else None
