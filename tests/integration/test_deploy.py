"""The launch recipes of deploy/ (docs/deploy.md; issue 18 item 7).

- deploy/slurm/datahelix.sbatch passes `bash -n` and shellcheck, and runs
  for real with network namespaces as nodes (test_multihost.py's Hosts):
  the script itself runs in "node" A as sbatch would run it on the first
  node, with a fake `srun` (tests/integration/slurm_shim/) that starts
  each step's tasks in the namespaces of its --nodelist.  So its own
  Coordinator, sidecar and torchrun lines start the real programs: two
  training nodes (A, B; one rank each, gloo across the veth link) and one
  sidecar node (C); every sample of the epoch is trained on once, the
  sidecar decodes some steps and sends them across, and nothing is left
  running afterwards (the namespaces' teardown checks).
- deploy/k8s/datahelix.yaml passes yamllint and parses (python3-yaml); its
  objects fit together (the Service selects the Coordinator's pods, the
  ports agree, every pod gets the key from the Secret as a 0600 file), and
  every flag its containers pass to `datahelix` is one that subcommand's
  --help lists.  No Kubernetes runs here, but each container's command line
  does, on the namespaces, as the kubelet would start it (the Services'
  names in /etc/hosts, the pod paths mapped, the pod IP and the Job index
  set): the init container's key copy, the Coordinator, a sidecar, and two
  training pods that train the epoch.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, _binary
from test_multihost import dataset, hosts, netns_capable  # noqa: F401

SBATCH = ROOT / "deploy" / "slurm" / "datahelix.sbatch"
K8S = ROOT / "deploy" / "k8s" / "datahelix.yaml"
SHIM = ROOT / "tests" / "integration" / "slurm_shim"
SIDECAR_ID = 1000  # the script's --server-id of its first sidecar


def test_sbatch_script_passes_bash_n_and_shellcheck():
    p = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: scripts/setup-deps.sh installs it"
    p = subprocess.run([sc, "-s", "bash", str(SBATCH)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    # #SBATCH lines sbatch would read: before the first command, each one
    # long option.
    head = SBATCH.read_text().split("\nset -euo pipefail", 1)[0]
    lines = [x for x in head.splitlines() if x.startswith("#SBATCH")]
    assert lines and all(re.fullmatch(r"#SBATCH --[a-z-]+(=\S+)?", x)
                         for x in lines), lines


def test_sbatch_script_refuses_to_run_without_its_settings(tmp_path):
    env = {"PATH": f"{SHIM}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    p = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and "DH_MANIFEST" in p.stderr, p.stderr


def test_sbatch_script_runs_ranks_and_sidecars_on_three_nodes(
        hosts, dataset, tmp_path):  # noqa: F811
    a, b, c = (hosts.addr[h] for h in "ABC")
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    manifest = dataset / "m.dhx"
    env = dict(
        os.environ,
        PATH=f"{SHIM}:{os.environ['PATH']}", HOME=str(home),
        SLURM_JOB_ID="4242", SLURM_JOB_NODELIST=f"{a},{b},{c}",
        DH_FAKE_SLURM_NODES=";".join([f"{a}={hosts.ns['A']}=br0",
                                      f"{b}={hosts.ns['B']}=eth0",
                                      f"{c}={hosts.ns['C']}=eth0"]),
        DH_MANIFEST=str(manifest),
        DH_TRAIN=f"{ROOT}/deploy/train_example.py --manifest {manifest} "
                 f"--out {out}",
        DH_TRAIN_NODES="2", DH_RANKS_PER_NODE="1", DH_SIDECAR_WORKERS="1",
        # round-robin: the sidecar gets its share of steps whatever the
        # cost model would say of this tiny set.
        DH_POLICY="round-robin",
        DATAHELIX=_binary(), DATAHELIX_BIN=_binary(),
        DH_TORCHRUN="/usr/bin/python3 -m torch.distributed.run",
        PYTHONPATH=str(ROOT / "python"))
    env.pop("DATAHELIX_KEYFILE", None)
    env.pop("DATAHELIX_COORDINATOR", None)
    p = subprocess.run(["ip", "netns", "exec", hosts.ns["A"], "bash",
                        str(SBATCH)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "training exited 0" in p.stderr, p.stderr[-2000:]
    assert f"Coordinator tcp://{a}:29400" in p.stderr, p.stderr[-2000:]

    ranks = [json.loads((out / f"rank{r}.json").read_text())
             for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world"] == 2 and r["total"] == 12 for r in ranks), ranks
    # 12 clips, 2 ranks, batch 2: 3 steps each, every clip once.
    assert [len(r["ids"]) for r in ranks] == [3, 3], ranks
    every = sorted(i for r in ranks for s in r["ids"] for i in s)
    assert every == list(range(12)), every
    # Steps that the sidecar on node C decoded and sent across, beside
    # steps of each rank's own local DataServer (server id rank + 1).
    served = [srv for r in ranks for step in r["servers"] for srv in step]
    assert SIDECAR_ID in served, served
    assert set(served) <= {1, 2, SIDECAR_ID}, served
    for r in range(2):
        tel = [json.loads(x) for x in
               (out / f"tel{r}.jsonl").read_text().splitlines() if x]
        for rec in tel:
            if rec["servers"] == [SIDECAR_ID]:
                assert rec["cross_ds_bytes"] > 0, rec
    # The job key the script made for the job is gone with it.
    assert not (home / ".datahelix" / "job-4242.key").exists()


# ---- Kubernetes ------------------------------------------------------------

def _docs():
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all(K8S.read_text()) if d]


def test_k8s_manifest_passes_yamllint():
    yl = shutil.which("yamllint")
    assert yl, "yamllint missing: scripts/setup-deps.sh installs it"
    p = subprocess.run([yl, "-s", "-c", str(ROOT / "deploy" / ".yamllint"),
                        str(K8S)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout


def _by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def _pod(obj):
    return obj["spec"]["template"]["spec"]


def test_k8s_objects_fit_together():
    k = _by_kind(_docs())
    assert set(k) >= {"Deployment", "Service", "Job"}, set(k)
    deps = {d["metadata"]["name"]: d for d in k["Deployment"]}
    coord, side = deps["datahelix-coordinator"], deps["datahelix-dataserver"]
    assert coord["spec"]["replicas"] == 1  # one Coordinator per job
    svc = {s["metadata"]["name"]: s for s in k["Service"]}
    cs = svc["datahelix-coordinator"]
    labels = coord["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(kk) == v for kk, v in cs["spec"]["selector"].items())
    port = cs["spec"]["ports"][0]["port"]
    cargs = " ".join(_pod(coord)["containers"][0]["args"])
    assert f"--listen tcp://0.0.0.0:{port}" in cargs, cargs
    job = k["Job"][0]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"]
    # The headless Service that gives the Job's pods their DNS names.
    sub = _pod(job)["subdomain"]
    assert svc[sub]["spec"]["clusterIP"] == "None"
    for obj in (coord, side, job):
        pod = _pod(obj)
        vols = {v["name"]: v for v in pod["volumes"]}
        secret = [v for v in vols.values() if "secret" in v]
        assert secret and secret[0]["secret"]["secretName"] == \
            "datahelix-job-key", obj["metadata"]["name"]
        # The key reaches datahelix as a 0600 regular file it owns (a
        # Secret volume's files are symlinks, which it refuses).
        init = " ".join(pod["initContainers"][0]["command"])
        assert "install -m 0600" in init, init
        text = json.dumps(pod["containers"])
        assert "/run/datahelix/job.key" in text
        assert f"tcp://datahelix-coordinator:{port}" in text or obj is coord


def _help_flags(sub):
    p = subprocess.run([_binary(), sub, "--help"], capture_output=True,
                       text=True, timeout=30)
    return set(re.findall(r"--[a-z][a-z-]+", p.stdout + p.stderr))


def test_k8s_commands_use_only_real_flags():
    seen = 0
    for d in _docs():
        if d["kind"] not in ("Deployment", "Job"):
            continue
        for c in _pod(d)["containers"]:
            argv = c.get("command", []) + c.get("args", [])
            text = " ".join(argv)
            for m in re.finditer(r"datahelix (coordinator|dataserver)\b(.*?)"
                                 r"(?:$|&&|;|\n)", text):
                sub, rest = m.group(1), m.group(2)
                bad = set(re.findall(r"--[a-z][a-z-]+", rest)) - \
                    _help_flags(sub)
                assert not bad, (d["metadata"]["name"], sub, bad)
                seen += 1
    assert seen >= 2, seen  # the Coordinator and the sidecars at least


# ---- the manifest's own commands, run on the namespaces ---------------------
#
# No cluster here, but each container's command is a plain program line: the
# test runs them as the pods would, on the three namespaces (the Coordinator
# pod and training pod 0 in A, training pod 1 in B, a sidecar pod in C), with
# the cluster's DNS names in each namespace's /etc/hosts (`ip netns exec`
# bind-mounts /etc/netns/NS/hosts over /etc/hosts), the pod paths mapped to
# this machine's (/data, /run/datahelix, /opt/datahelix), the downward API's
# pod IP and the Indexed Job's JOB_COMPLETION_INDEX set as the kubelet would.

def _pod_paths(s, key, data):
    return (s.replace("/run/datahelix/job.key", str(key))
            .replace("/data/", f"{data}/")
            .replace("/opt/datahelix/", f"{ROOT}/deploy/"))


def _container_env(c, pod_ip):
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            env[e["name"]] = pod_ip
    return env


def _pod_proc(hosts, host, name, container, key, data, env):
    from procs import FileProc
    argv = [_pod_paths(a, key, data)
            for a in container.get("command", []) + container.get("args", [])]
    if argv[0] == "datahelix":
        argv[0] = _binary()
    env = {k: _pod_paths(v, key, data) for k, v in env.items()}
    env.update(PYTHONPATH=str(ROOT / "python"), DATAHELIX_BIN=_binary())
    p = FileProc(["ip", "netns", "exec", hosts.ns[host], "env",
                  *[f"{k}={v}" for k, v in env.items()], *argv], name,
                 hosts.tmp)
    hosts.procs.append(p)
    return p


@pytest.fixture
def cluster_dns(hosts):
    """The Services' names resolve in every namespace to the pods' hosts."""
    made = []
    a = hosts.addr["A"]
    top = pathlib.Path("/etc/netns")
    had_top = top.exists()
    for ns in hosts.ns.values():
        d = pathlib.Path("/etc/netns") / ns
        d.mkdir(parents=True)
        made.append(d)
        (d / "hosts").write_text(
            "127.0.0.1 localhost\n"
            f"{a} datahelix-coordinator datahelix-train-0.datahelix-train\n")
    yield
    for d in made:
        shutil.rmtree(d)
    if not had_top:
        top.rmdir()


def test_k8s_manifest_commands_run_on_three_nodes(hosts, dataset,  # noqa: F811
                                                   cluster_dns):
    from procs import wait_until
    k = _by_kind(_docs())
    deps = {d["metadata"]["name"]: d for d in k["Deployment"]}
    job = k["Job"][0]
    key = hosts.tmp / "job.key"
    # The init container's line, then the Secret's file as it would be
    # mounted (0400, by `kubectl create secret --from-file`).
    secret = hosts.tmp / "secret"
    secret.mkdir()
    subprocess.run([_binary(), "keygen", secret / "job.key"], check=True,
                   capture_output=True, timeout=30)
    os.chmod(secret / "job.key", 0o400)
    init = _pod(job)["initContainers"][0]
    line = init["command"][-1].replace("/secret/", f"{secret}/")
    subprocess.run(["sh", "-c", _pod_paths(line, key, dataset)], check=True,
                   timeout=30)
    assert oct(key.stat().st_mode & 0o777) == "0o600"

    coord = _pod_proc(hosts, "A", "k8s-coordinator",
                      _pod(deps["datahelix-coordinator"])["containers"][0],
                      key, dataset, {})
    assert wait_until(lambda: "listening" in coord.stderr() or
                      coord.p.poll() is not None, 15), coord.stderr()
    assert coord.p.poll() is None, coord.stderr()
    side = _pod_proc(hosts, "C", "k8s-dataserver",
                     _pod(deps["datahelix-dataserver"])["containers"][0],
                     key, dataset, {})
    assert wait_until(lambda: "registered" in side.stderr() or
                      side.p.poll() is not None, 15), side.stderr()
    assert side.p.poll() is None, side.stderr()

    c = _pod(job)["containers"][0]
    n = job["spec"]["completions"]
    assert n == 2  # the pods' hosts below
    trains = []
    for idx, (host, ifname) in enumerate([("A", "br0"), ("B", "eth0")]):
        env = _container_env(c, hosts.addr[host])
        env.update(JOB_COMPLETION_INDEX=str(idx), GLOO_SOCKET_IFNAME=ifname)
        trains.append(_pod_proc(hosts, host, f"k8s-train-{idx}", c, key,
                                dataset, env))
    for t in trains:
        assert wait_until(lambda: t.p.poll() is not None, 240), t.name
        assert t.p.returncode == 0, t.stderr()[-3000:]
    said = "".join(t.stdout() + t.stderr() for t in trains)
    for r in range(2):
        assert f"rank {r}/2: 3 steps, job total 12 samples" in said, said[-2000:]
    assert side.p.poll() is None and coord.p.poll() is None
