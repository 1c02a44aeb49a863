"""The Slurm recipe on a real Slurm (issue 41 item 9): a one-node cluster
of Debian's slurm-wlm - its own munged, slurmctld and slurmd, started here
with private sockets, ports, state and logs, ended by pid - runs
deploy/slurm/datahelix.sbatch with `sbatch --wait`: the Coordinator and the
ranks (torchrun, 2 ranks with their local DataServers) as the job's steps,
every sample once.  (test_deploy.py runs the same script on three network
namespaces with a stand-in srun; this is the real engine, on one node.)
"""
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from conftest import ROOT, run_dh, stop_process, _binary

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo")


def _tool(name):
    for d in ("/usr/sbin", "/usr/bin"):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(tmp_path):
    """munged + slurmctld + slurmd of this test; yields the environment
    that points the Slurm commands at them."""
    if os.geteuid() != 0:
        pytest.skip("slurmd runs job steps as root here")
    tools = {n: _tool(n) for n in DAEMONS}
    missing = [n for n, p in tools.items() if not p]
    if missing:
        pytest.fail(f"{missing} not installed: scripts/setup-deps.sh installs "
                    "slurm-wlm and munge")
    d = tmp_path / "slurm"
    for sub in ("state", "spool", "log", "munge"):
        (d / sub).mkdir(parents=True)
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "munge.key"
    sock = d / "munge" / "munge.sock"
    subprocess.run([tools["mungekey"], "--create", f"--keyfile={key}"],
                   check=True, capture_output=True, timeout=30)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=dhtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/ctld.log
SlurmdLogFile={d}/log/d.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=dh Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []
    try:
        procs.append(subprocess.Popen(
            [tools["munged"], "--foreground", "--force", f"--socket={sock}",
             f"--key-file={key}", f"--pid-file={d}/munge/munged.pid",
             f"--log-file={d}/log/munged.log",
             f"--seed-file={d}/munge/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        end = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < end:
            time.sleep(0.05)
        for daemon in ("slurmctld", "slurmd"):
            procs.append(subprocess.Popen(
                [tools[daemon], "-D", "-f", str(conf)], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        end = time.monotonic() + 60
        state = ""
        while time.monotonic() < end:
            p = subprocess.run([tools["sinfo"], "-h", "-o", "%t"], env=env,
                               capture_output=True, text=True, timeout=20)
            state = p.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        if state != "idle":
            logs = "\n".join((d / "log" / f).read_text()[-1500:]
                             for f in ("ctld.log", "d.log")
                             if (d / "log" / f).exists())
            pytest.fail(f"the one-node cluster did not come up (sinfo: "
                        f"{state!r}):\n{logs}")
        yield env, tools
    finally:
        for p in reversed(procs):
            stop_process(p, timeout=10)


def test_the_sbatch_recipe_runs_on_a_real_slurm(cluster, tmp_path):
    env, tools = cluster
    data = tmp_path / "data"
    run_dh("gen-data", "--out", data / "clips", "--profiles", "S", "--count",
           8, "--seed", 2, check=True, timeout=300)
    run_dh("probe", "--out", data / "m.jsonl", "--index", data / "m.dhx",
           data / "clips", check=True)
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    env = dict(
        env, HOME=str(home), DH_MANIFEST=str(data / "m.dhx"),
        DH_TRAIN=f"{ROOT}/deploy/train_example.py --manifest "
                 f"{data / 'm.dhx'} --out {out}",
        DH_RANKS_PER_NODE="2", DH_POLICY="round-robin",
        DH_PORT=str(_free_port()), DH_MASTER_PORT=str(_free_port()),
        DATAHELIX=_binary(), DATAHELIX_BIN=_binary(),
        DH_TORCHRUN="/usr/bin/python3 -m torch.distributed.run",
        PYTHONPATH=str(ROOT / "python"))
    for k in ("DATAHELIX_KEYFILE", "DATAHELIX_COORDINATOR"):
        env.pop(k, None)
    job_out = tmp_path / "job.out"
    p = subprocess.run(
        [tools["sbatch"], "--wait", "--nodes=1", f"--output={job_out}",
         str(ROOT / "deploy" / "slurm" / "datahelix.sbatch")],
        env=env, capture_output=True, text=True, timeout=300)
    log = job_out.read_text() if job_out.exists() else ""
    assert p.returncode == 0, (p.stderr, log[-3000:])
    assert "training exited 0" in log, log[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text())
             for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    every = sorted(i for r in ranks for s in r["ids"] for i in s)
    assert every == list(range(8)), every
    # the job key the script made is gone with the job
    assert not list(home.glob(".datahelix/job-*.key"))
