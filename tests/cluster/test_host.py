"""The embedded cluster's host (execution/host.py): the processes it forks inherit its environment
(never this process's changes), import no training script and are forked from one thread; a
worker its nanny restarts is forked from it again; it ends when closed."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.timeout(120)


def _report(queue) -> None:  # run in a process the host forked (importable there: tests is on sys.path)
    import types

    import yaml

    from zephon_dask.execution.host import route_modules

    queue.put({"ppid": os.getppid(), "env": os.environ.get("ZEPHON_HOST_TEST"), "sid": os.getsid(0),
               "main": getattr(sys.modules["__main__"], "__file__", None),
               "imported": "zephon_host_script_was_imported" in os.environ,
               "distributed": "distributed" in sys.modules,
               "routes preloaded": all(name in sys.modules for name in route_modules()),
               "PyYAML's safe_load": isinstance(yaml.safe_load, types.FunctionType)})


def test_a_host_forks_processes_with_its_environment_and_no_training_script(tmp_path, monkeypatch):
    from zephon_dask.execution.host import Host

    script = tmp_path / "train.py"  # what multiprocessing would import as __mp_main__ in a child
    script.write_text("import os\nos.environ['zephon_host_script_was_imported'] = '1'\n")
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)
    before = dict(os.environ)
    host = Host({**os.environ, "ZEPHON_HOST_TEST": "from the host", "OPENBLAS_NUM_THREADS": "1"})
    try:
        queue = host.context.Queue()
        processes = [host.context.Process(target=_report, args=(queue,), daemon=True) for _ in range(2)]
        for p in processes:
            p.start()
        seen = [queue.get(timeout=60) for _ in processes]
        for p in processes:
            p.join(30)
        assert [p.exitcode for p in processes] == [0, 0]
        assert all(s == {"ppid": host.pid, "env": "from the host", "sid": host.pid, "main": None,
                         "imported": False, "distributed": True, "routes preloaded": True,
                         "PyYAML's safe_load": True} for s in seen), seen
        if os.path.isdir(f"/proc/{host.pid}/task"):  # forked from a process with one thread
            assert len(os.listdir(f"/proc/{host.pid}/task")) == 1
        assert dict(os.environ) == before
    finally:
        host.close(10)
    assert host.process.returncode is not None and not os.path.exists(host.directory)
    with pytest.raises(OSError, match="closed"):
        host.connect([])


def _package(queue) -> None:  # run in a process the host forked
    import zephon_dask

    queue.put(zephon_dask.__file__)


def test_a_host_imports_this_processs_package_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    """The host's modules come from this process's ``sys.path`` (its ``PYTHONPATH``), not from the
    working directory first: started there with ``-c``, the host (and every scheduler and worker
    forked from it) imported a ``zephon_dask`` the working directory held, such as another
    version's source tree, instead of the training process's."""
    import zephon_dask
    from zephon_dask.execution.host import Host

    path = os.pathsep.join(p or os.getcwd() for p in sys.path)  # as the embedded cluster sets it
    decoy = tmp_path / "zephon_dask"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('a zephon_dask in the working directory')\n")
    monkeypatch.chdir(tmp_path)
    host = Host({**os.environ, "PYTHONPATH": path})
    try:
        queue = host.context.Queue()
        process = host.context.Process(target=_package, args=(queue,), daemon=True)
        process.start()
        assert queue.get(timeout=60) == zephon_dask.__file__
        process.join(30)
    finally:
        host.close(10)


def _worker(dask_worker=None) -> dict:
    import os
    import sys

    return {"pid": os.getpid(), "ppid": os.getppid(), "malloc": os.environ.get("MALLOC_ARENA_MAX"),
            "omp": os.environ.get("OMP_NUM_THREADS"), "main": getattr(sys.modules["__main__"], "__file__", None),
            "memory_limit": dask_worker.memory_manager.memory_limit}


def test_a_killed_worker_is_forked_again_from_the_host_with_its_environment():
    from distributed import Client

    from zephon_dask.execution.cluster import embedded_pids, local_cluster

    before = dict(os.environ)
    with local_cluster(1, dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        host = cluster.scheduler.host.pid
        first, = client.run(_worker).values()
        assert (first["ppid"], first["malloc"], first["omp"], first["main"]) == (host, "1", "1", None)
        assert first["memory_limit"] > 0  # the nanny's share of the machine
        assert set(embedded_pids(cluster)) == {cluster.scheduler.process.pid, host, first["pid"]}
        os.kill(first["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        again = first
        while again["pid"] == first["pid"] and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                client.wait_for_workers(1, timeout=5)
                again, = client.run(_worker).values()
            except (OSError, ValueError, TimeoutError):
                pass  # the worker is being restarted
        assert again["pid"] != first["pid"], "the nanny did not restart its worker within 60 s"
        assert {k: v for k, v in again.items() if k != "pid"} == {k: v for k, v in first.items() if k != "pid"}
        assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
        assert dict(os.environ) == before
    assert not psutil.pid_exists(host) or psutil.Process(host).status() == psutil.STATUS_ZOMBIE


def test_the_hosts_yaml_loads_read_the_same_config_and_are_put_back():
    """The host reads Dask's config files with libyaml's parser while it imports: the same values,
    and ``yaml.safe_load`` is PyYAML's again afterwards."""
    from pathlib import Path

    import distributed
    import yaml

    from zephon_dask.execution.host import libyaml_loads

    text = (Path(distributed.__file__).parent / "distributed.yaml").read_text()
    before = yaml.safe_load
    with libyaml_loads():
        fast = yaml.safe_load(text)
        assert yaml.safe_load is not before or getattr(yaml, "CSafeLoader", None) is None
    assert yaml.safe_load is before
    assert fast == yaml.safe_load(text)


def test_a_process_abandoned_before_its_start_ends_without_a_traceback():
    """What the host's ``sys.excepthook`` keeps quiet: a process whose requester released what it
    sent before the process read it (here: the data pipe closed with nothing in it, Python's own
    ``spawn._main`` reading it), and nothing else."""
    import multiprocessing.spawn

    from zephon_dask.execution.host import abandoned_before_start

    r, w = os.pipe()
    os.close(w)
    with pytest.raises(EOFError) as cut_short:
        multiprocessing.spawn._main(r, -1)
    assert abandoned_before_start(cut_short.value)
    with pytest.raises(FileNotFoundError) as elsewhere:
        open(os.path.join(os.path.dirname(__file__), "no such file"))
    assert not abandoned_before_start(elsewhere.value)
    assert not abandoned_before_start(ValueError("raised in spawn._main would still be printed"))
