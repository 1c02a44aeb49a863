"""Issue 13's attacks against a real job: `datahelix coordinator --listen
tcp://127.0.0.1:P` and a 2-rank `consume` epoch, with a hostile peer
(build/dh_attacker, tests/integration/dh_attacker.c) hammering the
Coordinator the whole time: Shutdowns, registrations as each rank's local
DataServer and client, forged error notices and requests for the ranks'
task ids.  Before issue 13 the first Shutdown stopped the job; now both
ranks deliver every sample of the epoch exactly once and exit 0, the
Coordinator outlives the attack and says what it refused.  Processes are
ended by pid, the Coordinator binds loopback, every wait is bounded."""
import os
import subprocess

from conftest import _binary, run_dh
from procs import assert_two_ranks_got_their_plans, free_port, wait_until
from test_runtime import Proc, consume_args, first_step_line, start_consume

import pytest


def attacker():
    path = os.path.join(os.path.dirname(_binary()), "dh_attacker")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} not built")
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("attacks")
    run_dh("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
           12, "--seed", 3, check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl", "--index", d / "m.dhx",
           d / "videos", check=True)
    return d


def test_two_rank_epoch_survives_an_attacker(dataset, tmp_path):
    m = dataset / "m.dhx"
    coord = f"tcp://127.0.0.1:{free_port()}"
    c = Proc("coordinator", "--listen", coord, "--heartbeat-timeout-ms", 3000)
    procs, att = [], None
    try:
        assert wait_until(lambda: "listening on" in c.err_so_far()
                          or c.p.poll() is not None, 10), c.stop()
        assert c.p.poll() is None, c.stop()
        # --window-ms stretches the epoch over the attack; the ranks are
        # registered (they hold their claims) once each printed a step.
        procs = [start_consume(*consume_args(
            coord, m, r, 2, 2, "--window-ms", 400, "--epochs", 3,
            "--ids-out", tmp_path / f"ids{r}")) for r in range(2)]
        for p in procs:
            first_step_line(p)
        att = subprocess.Popen([attacker(), coord, "2", "3"],
                               stdout=subprocess.PIPE, text=True)
        outs = [p.communicate(timeout=180) for p in procs]
        aout, _ = att.communicate(timeout=30)
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err
        assert "messages sent" in aout and " 0 messages" not in aout, aout
        assert_two_ranks_got_their_plans(m, tmp_path, 3, 12)
        assert c.p.poll() is None  # the Shutdowns did not stop it
    finally:
        for p in procs + ([att] if att else []):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
        _, _, cerr = c.stop()
    assert "refused shutdown" in cerr, cerr
    # The exit line counts every refusal, the log shows at most 20 a second.
    stopped = [x for x in cerr.splitlines() if "coordinator: info: stopped:" in x]
    assert len(stopped) == 1, cerr
    refused = int(stopped[0].split("refused ")[1].split(",")[0])
    assert refused > 1000, stopped
    assert cerr.count("refused ") < 20 * 60, "the log is not rate-limited"
    assert "refused register_server" in cerr, cerr
    assert "shutdown requested" not in cerr, cerr
