"""The cluster-manager examples of docs/clusters.md checked without a cluster manager: the Kubernetes
manifests against the Kubernetes API's models and the operator's own DaskCluster, the pieces that
must agree across files, the sbatch script's commands, and dask-jobqueue's job script rendered."""

from __future__ import annotations

import copy
import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "kubernetes"
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manifests() -> dict[str, dict]:
    """Every object of examples/kubernetes/*.yaml by ``kind/name``."""
    docs = [d for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def as_model(data: dict, model: str) -> dict:
    """``data`` read by the Kubernetes API's model ``model`` and written back: a field the API does
    not know is dropped (so the result differs), a wrong type raises."""
    client = pytest.importorskip("kubernetes.client")
    return client.ApiClient().sanitize_for_serialization(getattr(client, model).from_dict(data))


def paths(tree, prefix=()) -> set[tuple]:
    """The key paths of a nested dict (list items by position)."""
    out = set()
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        out.add((*prefix, key))
        out |= paths(value, (*prefix, key))
    return out


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def long_options(command: str) -> dict[str, str]:
    """``--name=value`` options of a command line (``$VAR`` kept as written)."""
    return dict(re.findall(r"--([\w-]+)=(\S+)", command))


def script_args(command: str, script: str = "examples/clusters/train.py") -> list[str]:
    """The arguments after ``script`` in a command line, shell quotes removed, ``$VAR`` kept."""
    return [a for a in shlex.split(command.split(script, 1)[1]) if a != "&"]


def assert_train_takes(args: list[str]) -> None:
    """examples/clusters/train.py has every option in ``args``, its required ones among them (read
    from its source: importing it would import torch)."""
    source = (ROOT / "examples" / "clusters" / "train.py").read_text()
    known = set(re.findall(r'add_argument\("(--[\w-]+)"', source))
    given = [a.split("=")[0] for a in args]
    assert set(given) <= known and "--ckpt" in given, (given, known)
    assert len({"--scheduler-file", "--address", "--threads"} & set(given)) == 1, given


def test_every_kubernetes_object_is_what_the_api_reads_and_a_typo_is_caught():
    objects = manifests()
    assert set(objects) == {"PersistentVolumeClaim/zephon-shared", "DaskCluster/zephon", "Service/zephon-train",
                            "Job/zephon-train"}
    for key, obj in objects.items():
        if obj["kind"] == "DaskCluster":
            for role in ("scheduler", "worker"):
                assert as_model(obj["spec"][role]["spec"], "V1PodSpec") == obj["spec"][role]["spec"], role
            assert as_model(obj["spec"]["scheduler"]["service"], "V1ServiceSpec") == obj["spec"]["scheduler"]["service"]
        else:
            assert as_model(obj, f"V1{obj['kind']}") == obj, key
    typo = copy.deepcopy(objects["Job/zephon-train"])  # the check can fail: a misspelt field
    typo["spec"]["template"]["spec"]["containers"][0]["volumMounts"] = []
    assert as_model(typo, "V1Job") != typo


def test_the_dask_cluster_holds_everything_the_operators_own_spec_has():
    operator = pytest.importorskip("dask_kubernetes.operator")
    ours = manifests()["DaskCluster/zephon"]
    worker = container(ours["spec"]["worker"]["spec"], "worker")
    env = {e["name"]: e["value"] for e in worker["env"]}
    theirs = operator.make_cluster_spec("zephon", image=worker["image"], n_workers=ours["spec"]["worker"]["replicas"],
                                        resources={"limits": {"memory": "4Gi"}})
    for c in theirs["spec"]["scheduler"]["spec"]["containers"]:
        if not c.get("env"):
            c.pop("env", None)  # an empty list when no env is given
    assert (theirs["apiVersion"], theirs["kind"]) == (ours["apiVersion"], ours["kind"])
    assert paths(theirs) <= paths(ours), sorted(paths(theirs) - paths(ours))
    assert theirs["spec"]["scheduler"]["service"] == ours["spec"]["scheduler"]["service"]
    assert worker["args"][:3] == theirs["spec"]["worker"]["spec"]["containers"][0]["args"][:3]
    assert worker["args"][worker["args"].index("--nthreads") + 1] == "1"
    assert env == {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_the_training_job_reaches_the_dask_cluster_its_rank_zero_and_the_shared_volume():
    objects = manifests()
    cluster, job, service = objects["DaskCluster/zephon"], objects["Job/zephon-train"], objects["Service/zephon-train"]
    pod = job["spec"]["template"]["spec"]
    train = container(pod, "train")
    command = " ".join(train["args"])
    opts = long_options(command)
    comm = next(p for p in cluster["spec"]["scheduler"]["service"]["ports"] if p["name"] == "tcp-comm")
    assert opts["address"] == f"tcp://{cluster['metadata']['name']}-scheduler:{comm['port']}"  # the operator's Service
    assert int(opts["nnodes"]) == job["spec"]["completions"] == job["spec"]["parallelism"]
    assert opts["nproc-per-node"] == train["resources"]["limits"]["nvidia.com/gpu"]
    assert job["spec"]["completionMode"] == "Indexed" and opts["node-rank"] == "$JOB_COMPLETION_INDEX"
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert opts["master-addr"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(opts["master-port"]) == service["spec"]["ports"][0]["port"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in job["spec"]["podFailurePolicy"]["rules"]
    assert 60 <= int(opts["shutdown-timeout"]) < pod["terminationGracePeriodSeconds"]  # torchrun SIGKILLs first
    claim = objects["PersistentVolumeClaim/zephon-shared"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for spec, c in ((pod, train), (cluster["spec"]["worker"]["spec"], container(cluster["spec"]["worker"]["spec"], "worker"))):
        volume = next(v for v in spec["volumes"] if v["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"])
        assert any(m["name"] == volume["name"] and m["mountPath"] == "/shared" for m in c["volumeMounts"])
    assert opts["ckpt"].startswith("/shared/")
    assert_train_takes(script_args(command))


def sbatch_commands() -> dict[str, str]:
    """The commands the sbatch script starts, by program, joined across continuation lines."""
    text = SBATCH.read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        if line.startswith("srun "):
            for program in ("dask scheduler", "dask worker", "torchrun"):
                if f" {program} " in line:
                    found[program] = line
    return found


def test_the_sbatch_script_parses_signals_early_requeues_and_starts_the_three_steps():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SBATCH.read_text(), re.M))
    assert re.fullmatch(r"B:USR1@\d+", directives["signal"]) and "requeue" in directives
    commands = sbatch_commands()
    assert set(commands) == {"dask scheduler", "dask worker", "torchrun"}
    for program, line in commands.items():  # srun's options are --name=value: the test's srun drops them
        srun_opts = line.split(f" {program} ")[0].split()[1:]
        assert all(o.startswith("--") and ("=" in o or o == "--overlap") for o in srun_opts), line
    scheduler, worker = long_options(commands["dask scheduler"]), long_options(commands["dask worker"])
    assert scheduler["scheduler-file"] == worker["scheduler-file"] == '"$SCHEDULER_FILE"'
    assert worker["nthreads"] == "1"
    shown = next(b for b in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "clusters.md").read_text(), re.S)
                 if b.startswith("srun "))
    for command in shown.split("&\n")[:-1]:  # docs/clusters.md shows the script's commands as they are
        assert f"{command}&\n" in SBATCH.read_text(), command
    early = int(directives["signal"].rsplit("@", 1)[1])
    assert 60 <= int(long_options(commands["torchrun"])["shutdown-timeout"]) < early
    args = script_args(commands["torchrun"])
    assert_train_takes(args)
    assert "--scheduler-file=$SCHEDULER_FILE" in args and "--ckpt=$SHARED/ckpt" in args


def test_dask_jobqueue_renders_the_worker_job_without_submitting_it(tmp_path):
    pytest.importorskip("dask_jobqueue")
    example = load(ROOT / "examples" / "slurm" / "dask_workers.py", "example_dask_workers")
    scheduler_file = tmp_path / "scheduler.json"
    with example.make_cluster(str(scheduler_file), host="127.0.0.1", dashboard_address=":0") as cluster:
        script = cluster.job_script()
        address = yaml.safe_load(scheduler_file.read_text())["address"]  # JSON is YAML
    worker = next(line for line in script.splitlines() if "dask_worker" in line).split()
    assert worker[worker.index("distributed.cli.dask_worker") + 1] == address  # the scheduler the ranks read
    assert worker[worker.index("--nthreads") + 1] == "1" and worker[worker.index("--nworkers") + 1] == "32"
    shown = next(b for b in re.findall(r"```text\n(.*?)```", (ROOT / "docs" / "clusters.md").read_text(), re.S)
                 if "#SBATCH -J zephon-dask" in b)
    python, _, rest = script.partition(" -m distributed.cli.dask_worker ")
    rendered = python.rsplit("\n", 1)[0] + "\npython -m distributed.cli.dask_worker " + rest
    assert rendered.replace(address, "tcp://10.0.0.5:41521").strip() == shown.strip()  # the page shows it
