"""Tests for ``hpcsched.slurm.observe``.

* The parsers it uses are tested in ``tests/test_slurm_parse.py`` and ``tests/test_hostlist.py``.
* CLI-backend tests with fake ``squeue``/``sinfo`` executables on ``PATH`` (no Slurm needed).
* Contract tests (``@pytest.mark.slurm``) that every usable backend must pass on the dev cluster;
  the pyslurm case is skipped with ``pyslurm_usable()``'s reason where pyslurm cannot run.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcsched import slurm
from hpcsched.slurm import SlurmError, SlurmUnavailable, expand_hostlist
from hpcsched.slurm.observe import (
    Backend,
    BackendUnusable,
    Observation,
    PyslurmBackend,
    SlurmCLIBackend,
    make_backend,
    pyslurm_usable,
)
from tests.conftest import wait_for
from tests.slurm_outputs import (
    SINFO_DOWN,
    SINFO_IDLE,
    SINFO_RUNNING,
    SQUEUE_DOWN,
    SQUEUE_RUNNING,
    node,
    sinfo,
)

# --------------------------------------------------------------------------------------------
# CLI backend against fake squeue/sinfo (no Slurm needed)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Put fake ``squeue``/``sinfo`` first on PATH; ``install(name, body)`` writes one (a Python
    script body). Each appends its argv to ``calls.log``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def install(name: str, body: str) -> None:
        p = bindir / name
        p.write_text(f"#!{sys.executable}\nimport sys, time\n"
                     f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                     + textwrap.dedent(body))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)

    def calls() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    return SimpleNamespace(install=install, calls=calls, dir=bindir)


def _serve(text: str) -> str:
    return f"sys.stdout.write({text!r})\n"


def test_cli_backend_observe_with_fakes(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_RUNNING))
    fake_slurm.install("sinfo", _serve(SINFO_RUNNING))
    b = SlurmCLIBackend(timeout=10)
    assert isinstance(b, Backend) and b.name == "cli"
    t0, before = time.time(), slurm.calls()
    obs = b.observe()
    assert isinstance(obs, Observation)
    assert t0 <= obs.time <= time.time()
    assert obs.calls == 2 and b.calls == 2
    assert slurm.calls() - before == 2  # the counter the daemon's round statistics read
    assert sorted(fake_slurm.calls()) == ["--json", "--json --states=all"]  # sinfo, squeue
    assert obs.jobs["61"].state == "RUNNING" and obs.node("n2").gpus_allocated == 4
    with pytest.raises(TypeError):
        obs.jobs["x"] = None  # read-only mapping
    b.observe()
    assert b.calls == 4


def test_cli_backend_observes_the_jobs_alone_with_squeue_alone(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_RUNNING))
    fake_slurm.install("sinfo", _serve(SINFO_RUNNING))
    b, before = SlurmCLIBackend(timeout=10), slurm.calls()
    obs = b.observe(jobs_only=True)
    assert (obs.calls, b.calls, slurm.calls() - before) == (1, 1, 1)
    assert fake_slurm.calls() == ["--json --states=all"]   # squeue; no sinfo
    assert obs.jobs["61"].state == "RUNNING" and obs.nodes == ()


def test_cli_backend_reads_backfills_planned_nodes_on_22_05(fake_slurm):
    """Slurm 22.05's JSON has a pending job's planned start but not its nodes: asked for them,
    the backend reads them with one more ``squeue`` (``%Y``); where the JSON has them, none."""
    planned = SQUEUE_RUNNING.replace(
        '"state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", '
        '"nodes": "", "node_count": 1, "tres_per_node": ""',
        '"state_reason": "Resources", "start_time": 1795928248, "name": "wrap", "user_name": '
        '"bob", "partition": "gpu", "nodes": "", "node_count": 2, "tres_per_node": "gres:gpu:4"')
    assert planned != SQUEUE_RUNNING
    fake_slurm.install("squeue", "if '--json' in sys.argv:\n    " + _serve(planned)
                       + "else:\n    sys.stdout.write('60|n[2-3]\\n77|(null)\\n')\n")
    fake_slurm.install("sinfo", _serve(SINFO_RUNNING))
    b, before = SlurmCLIBackend(timeout=10, plans_max_age=0), slurm.calls()
    seen = b.observe()
    assert seen.calls == 2 and seen.jobs["60"].scheduled_nodes is None
    obs = b.with_planned_nodes(seen)
    assert obs.calls == 3 and b.calls == 3 and slurm.calls() - before == 3
    assert "-h -t PENDING -o %i|%Y" in fake_slurm.calls()
    assert obs.jobs["60"].scheduled_nodes == "n[2-3]" and obs.jobs["61"].scheduled_nodes is None
    assert obs.jobs["61"] == seen.jobs["61"] and obs.nodes == seen.nodes
    with pytest.raises(TypeError):
        obs.jobs["x"] = None  # read-only mapping, as observe's
    # the next observation reads them beside squeue and sinfo, not after: still 3 calls
    again = b.observe()
    assert again.calls == 3 and b.calls == 6 and again.jobs["60"].scheduled_nodes is None
    obs = b.with_planned_nodes(again)
    assert obs.calls == 3 and b.calls == 6 and obs.jobs["60"].scheduled_nodes == "n[2-3]"
    assert fake_slurm.calls().count("-h -t PENDING -o %i|%Y") == 2
    known = Observation(obs.time, obs.nodes, obs.jobs, 2)   # every pending job's nodes known
    assert b.with_planned_nodes(known) is known and b.calls == 6
    assert b.observe().calls == 2 and b.calls == 8      # not needed last time: not read
    b.with_planned_nodes(b.observe())                   # needed again: read after (9, 10, 11)
    assert b.observe().calls == 3 and b.calls == 14     # read beside, but not asked for
    assert b.observe().calls == 2 and b.calls == 16     # so not read again


def test_cli_backend_uses_planned_nodes_for_a_backfill_cycle(fake_slurm):
    """An answer of planned nodes is used for plans_max_age seconds (backfill plans once a
    bf_interval): no call within it, neither beside the next observation nor after it; one
    once it is older."""
    planned = SQUEUE_RUNNING.replace(
        '"state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", '
        '"nodes": "", "node_count": 1, "tres_per_node": ""',
        '"state_reason": "Resources", "start_time": 1795928248, "name": "wrap", "user_name": '
        '"bob", "partition": "gpu", "nodes": "", "node_count": 2, "tres_per_node": "gres:gpu:4"')
    fake_slurm.install("squeue", "if '--json' in sys.argv:\n    " + _serve(planned)
                       + "else:\n    sys.stdout.write('60|n[2-3]\\n')\n")
    fake_slurm.install("sinfo", _serve(SINFO_RUNNING))
    b = SlurmCLIBackend(timeout=10, plans_max_age=30)
    first = b.with_planned_nodes(b.observe())
    assert (first.calls, b.calls) == (3, 3) and first.jobs["60"].scheduled_nodes == "n[2-3]"
    again = b.observe()                                  # 30 s have not passed: not read
    assert again.calls == 2 and b.with_planned_nodes(again).jobs["60"].scheduled_nodes == "n[2-3]"
    assert b.calls == 5
    later = b.with_planned_nodes(replace(again, time=first.time + 30))     # a cycle on: read
    assert later.calls == 3 and b.calls == 6 and later.jobs["60"].scheduled_nodes == "n[2-3]"
    assert fake_slurm.calls().count("-h -t PENDING -o %i|%Y") == 2
    with pytest.raises(ValueError, match="plans_max_age"):
        SlurmCLIBackend(plans_max_age=-1)


def test_cli_backend_a_failed_read_beside_is_the_planned_nodes_error(fake_slurm):
    """The planned nodes read beside squeue and sinfo fail: the observation stands, and
    with_planned_nodes raises that error (the daemon's round goes on without the plans)."""
    planned = SQUEUE_RUNNING.replace('"state_reason": "JobHeldUser", "name"',
                                     '"state_reason": "Resources", "start_time": 1795928248, "name"')
    assert planned != SQUEUE_RUNNING
    fake_slurm.install("squeue", "if '--json' in sys.argv:\n    " + _serve(planned)
                       + "else:\n    sys.stderr.write('slurm_load_jobs error: boom\\n')\n"
                       + "    sys.exit(1)\n")
    fake_slurm.install("sinfo", _serve(SINFO_RUNNING))
    b = SlurmCLIBackend(timeout=10, plans_max_age=0)
    with pytest.raises(SlurmError):
        b.with_planned_nodes(b.observe())
    seen = b.observe()                    # read beside it now, and failed again
    assert seen.calls == 3 and seen.jobs["60"].state == "PENDING"
    with pytest.raises(SlurmError, match="boom"):
        b.with_planned_nodes(seen)


def test_cli_backend_partitions_filter(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_RUNNING))
    fake_slurm.install("sinfo", _serve(sinfo(node("a1", partitions=["gpu"]),
                                             node("b1", partitions=["cpu"]),
                                             node("c1", partitions=["cpu", "debug"]))))
    assert [n.name for n in SlurmCLIBackend(partitions=["cpu"]).observe().nodes] == ["b1", "c1"]
    assert [n.name for n in SlurmCLIBackend(partitions="debug,gpu").observe().nodes] == ["a1", "c1"]
    assert len(SlurmCLIBackend().observe().nodes) == 3
    # jobs are never filtered
    assert len(SlurmCLIBackend(partitions=["nope"]).observe().jobs) == 3


def test_cli_backend_timeout_is_unavailable(fake_slurm):
    fake_slurm.install("squeue", "time.sleep(30)\n")
    fake_slurm.install("sinfo", _serve(SINFO_IDLE))
    b = SlurmCLIBackend(timeout=0.5)
    t = time.monotonic()
    with pytest.raises(SlurmUnavailable, match="did not answer"):
        b.observe()
    assert time.monotonic() - t < 10
    assert b.calls == 2


def test_cli_backend_down_json_is_unavailable(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_DOWN))
    fake_slurm.install("sinfo", _serve(SINFO_DOWN))
    with pytest.raises(SlurmUnavailable):
        SlurmCLIBackend().observe()


def test_cli_backend_garbage_and_exit_status(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_RUNNING[:100]))
    fake_slurm.install("sinfo", _serve(SINFO_IDLE))
    with pytest.raises(SlurmError, match="squeue --json"):
        SlurmCLIBackend().observe()
    fake_slurm.install("squeue", "sys.stderr.write('squeue: error: Invalid user\\n'); sys.exit(1)\n")
    with pytest.raises(SlurmError, match="Invalid user") as ei:
        SlurmCLIBackend().observe()
    assert not isinstance(ei.value, SlurmUnavailable)


def test_cli_backend_rejects_bad_timeout():
    with pytest.raises(ValueError):
        SlurmCLIBackend(timeout=0)


# --------------------------------------------------------------------------------------------
# pyslurm mapping, with a stand-in module (pyslurm itself is not installable here)
# --------------------------------------------------------------------------------------------


def _fake_pyslurm(node_alloc: dict | None):
    jobs = {
        61: SimpleNamespace(id=61, name="wrap", user_name="root", state="RUNNING",
                            state_reason="None", partition="gpu", allocated_nodes="n[1-2]",
                            num_nodes=2, gres_per_node={"gpu": 2}, requeue_count=0,
                            batch_host="n1", priority=10),
        60: SimpleNamespace(id=60, name="wrap", user_name="root", state="PENDING",
                            state_reason="JobHeldUser", partition="gpu", allocated_nodes=None,
                            num_nodes=1, gres_per_node={}, requeue_count=0, batch_host=None,
                            priority=0),
    }
    nodes = {f"n{k}": SimpleNamespace(
        name=f"n{k}", configured_gres={"gpu": 4}, state="MIXED" if k <= 2 else "IDLE+DRAIN",
        allocated_gres=(node_alloc or {}).get(f"n{k}", {}), partitions=["gpu"])
        for k in range(1, 4)}
    return SimpleNamespace(
        Jobs=SimpleNamespace(load=lambda: jobs), Nodes=SimpleNamespace(load=lambda: nodes))


@pytest.mark.parametrize("alloc", [
    {"n1": {"gpu": {"count": "2", "indexes": "0-1"}}, "n2": {"gpu:a100": 2}},
    None,  # pyslurm < 23.2.3 leaves allocated_gres empty: summed from running jobs instead
])
def test_pyslurm_mapping_with_stand_in(alloc):
    b = PyslurmBackend(partitions=["gpu"], _module=_fake_pyslurm(alloc))
    before = slurm.calls()
    obs = b.observe()
    assert obs.calls == 2 and b.calls == 2 and b.name == "pyslurm"
    assert slurm.calls() - before == 2  # counted where the daemon reads it (review B1)
    assert obs.jobs["61"].gpus_per_node == 2 and obs.jobs["61"].node_count == 2
    assert obs.jobs["60"].state == "PENDING" and obs.jobs["60"].nodes == ""
    got = {n.name: (n.gpus, n.gpus_allocated, n.state) for n in obs.nodes}
    assert got == {"n1": (4, 2, "mixed"), "n2": (4, 2, "mixed"), "n3": (4, 0, "idle+drain")}


def test_pyslurm_rpc_errors_are_mapped():
    def boom():
        raise RuntimeError("Unable to contact slurm controller (connect failure)")
    mod = SimpleNamespace(Jobs=SimpleNamespace(load=boom), Nodes=SimpleNamespace(load=dict))
    with pytest.raises(SlurmUnavailable):
        PyslurmBackend(_module=mod).observe()
    mod.Jobs.load = lambda: {1: SimpleNamespace(id=1, num_nodes="x")}
    with pytest.raises(SlurmError, match="unexpected data"):
        PyslurmBackend(_module=mod).observe()


# --------------------------------------------------------------------------------------------
# Choosing a backend
# --------------------------------------------------------------------------------------------


def test_make_backend_choices():
    assert isinstance(make_backend("cli", timeout=5, partitions=["gpu"]), SlurmCLIBackend)
    ok, reason = pyslurm_usable()
    assert isinstance(reason, str) and reason
    auto = make_backend("auto")
    assert auto.name == ("pyslurm" if ok else "cli")
    if not ok:
        with pytest.raises(BackendUnusable, match="pyslurm"):
            make_backend("pyslurm")
    with pytest.raises(ValueError):
        make_backend("rest")


# --------------------------------------------------------------------------------------------
# Contract tests on the dev cluster, for every backend usable here
# --------------------------------------------------------------------------------------------

BACKENDS = ["cli", "pyslurm"]


def _require(kind: str) -> None:
    if kind == "pyslurm":
        ok, reason = pyslurm_usable()
        if not ok:
            pytest.skip(f"pyslurm backend not usable here: {reason}")


@pytest.fixture(params=BACKENDS)
def backend(request):
    """A backend of each kind, on the dev cluster (skipped, with the reason, where unusable)."""
    _require(request.param)
    request.getfixturevalue("devcluster")
    return make_backend(request.param, timeout=20)


def _sbatch(*args: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], check=False,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _submit_held(n: int, jobs: list[str]) -> list[str]:
    ids = []
    for _ in range(n):
        ids.append(_sbatch("--hold", "-J", "hpcsched-test-backend", "--wrap", "true"))
        jobs.append(ids[-1])
    return ids


@pytest.mark.slurm
def test_contract_nodes(backend):
    obs = backend.observe()
    nodes = {n.name: n for n in obs.nodes}
    assert set(nodes) == {"n1", "n2", "n3", "n4"}
    for n in nodes.values():
        assert n.gpus == 4 and "gpu" in n.partitions
        assert 0 <= n.gpus_allocated <= 4
        assert n.state.split("+")[0] in ("idle", "mixed", "allocated")
    assert obs.calls == 2
    assert abs(obs.time - time.time()) < 60


@pytest.mark.slurm
def test_contract_held_job_is_pending(backend, slurm_jobs):
    (jid,) = _submit_held(1, slurm_jobs)
    job = backend.observe().jobs[jid]
    assert job.state == "PENDING" and job.state_reason == "JobHeldUser"
    assert job.nodes == "" and job.node_count == 1


@pytest.mark.slurm
def test_contract_running_gpu_job(backend, slurm_jobs):
    jid = _sbatch("-N2", "--gres=gpu:2", "-J", "hpcsched-test-backend", "--wrap", "sleep 30")
    slurm_jobs.append(jid)
    obs = wait_for(lambda: (o := backend.observe()).jobs[jid].state == "RUNNING" and o,
                   60, f"job {jid} RUNNING")
    job = obs.jobs[jid]
    assert (job.node_count, job.gpus_per_node) == (2, 2)
    hosts = expand_hostlist(job.nodes)
    assert len(hosts) == 2

    def consistent():
        # Other tests share the cluster: a node's GPUs in use are ours plus theirs. Compare with
        # the running jobs in the same observation (retrying past a job starting between calls).
        o = backend.observe()
        if o.jobs[jid].state != "RUNNING":
            pytest.fail(f"job {jid} left RUNNING: {o.jobs[jid].state}")
        for h in hosts:
            want = sum(j.gpus_per_node for j in o.jobs.values()
                       if j.state == "RUNNING" and h in expand_hostlist(j.nodes))
            n = o.node(h)
            if n is None or n.gpus_allocated != want:
                return False
            assert n.gpus_allocated >= 2 and n.state.split("+")[0] in ("mixed", "allocated")
        return True

    wait_for(consistent, 20, "node gpus_allocated to match the running jobs")


@pytest.mark.slurm
def test_the_gpus_a_job_holds_and_each_nodes_free_ones_come_from_slurms_idx_lists(devcluster, slurm_jobs):
    """Real ``squeue --json``'s ``gres_detail`` names the GPUs a job holds; the snapshot's
    free GPUs per node (what PAL's placement ranks, :mod:`hpcsched.policies.placement.gpus`)
    are the node's others, as many as sinfo says are free."""
    from hpcsched.views.build import cluster_snapshot, held_gpus

    backend = make_backend("cli", timeout=20)
    jid = _sbatch("-N1", "--gres=gpu:3", "-J", "hpcsched-test-backend", "--wrap", "sleep 30")
    slurm_jobs.append(jid)

    def seen():
        # other tests share the cluster: retry past a job starting between squeue and sinfo
        o = backend.observe()
        job = o.jobs[jid]
        if job.state != "RUNNING":
            return None
        (host,) = expand_hostlist(job.nodes)
        node = {n.name: n for n in cluster_snapshot(o, ()).nodes}[host]
        return (job, host, node) if node.free_index is not None else None

    job, host, node = wait_for(seen, 60, f"job {jid} RUNNING with its GPUs known")
    (held,) = job.gpu_index
    assert len(held) == 3 and set(held) <= {0, 1, 2, 3}
    assert held_gpus((job,)) == tuple((host, i) for i in held)
    assert not set(node.free_index) & set(held)
    assert len(node.free_index) == node.gpus - node.gpus_allocated


@pytest.mark.slurm
def test_contract_calls_do_not_grow_with_jobs(backend, slurm_jobs):
    first = _submit_held(1, slurm_jobs)
    before = backend.calls
    obs = backend.observe()
    assert obs.calls == 2 and backend.calls - before == 2
    assert first[0] in obs.jobs
    ids = first + _submit_held(49, slurm_jobs)
    before = backend.calls
    obs = backend.observe()
    assert obs.calls == 2 and backend.calls - before == 2
    assert all(obs.jobs[i].state == "PENDING" for i in ids)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dead_controller_conf(devcluster, tmp_path: Path) -> Path:
    """A copy of the dev cluster's config whose SlurmctldPort nothing listens on."""
    src = Path(devcluster).parent
    dst = tmp_path / "etc"
    dst.mkdir()
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    conf = dst / "slurm.conf"
    lines = [ln for ln in conf.read_text().splitlines()
             if not ln.strip().lower().startswith("slurmctldport=")]
    lines.insert(0, f"SlurmctldPort={_closed_port()}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


_OBSERVE_ONCE = """
import sys, time
from hpcsched.slurm.observe import make_backend
b = make_backend(sys.argv[1], timeout=float(sys.argv[2]))
t = time.monotonic()
try:
    b.observe()
    print("OK", b.calls)
except Exception as e:
    print(type(e).__name__, round(time.monotonic() - t, 1), e)
"""


@pytest.mark.slurm
@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("timeout", [
    pytest.param(3.0, id="killed-at-timeout"),
    pytest.param(20.0, id="client-gives-up", marks=pytest.mark.slow),  # about 9 s, exit 0
])
def test_contract_dead_controller_is_unavailable(kind, timeout, devcluster, tmp_path):
    """Controller not answering -> SlurmUnavailable. Run in a subprocess with SLURM_CONF pointing
    at a copy of slurm.conf with a closed SlurmctldPort (libslurm reads the config once per
    process); the real slurmctld is left alone."""
    _require(kind)
    conf = _dead_controller_conf(devcluster, tmp_path)
    proc = subprocess.run([sys.executable, "-c", _OBSERVE_ONCE, kind, str(timeout)], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURM_CONF": str(conf)})
    out = proc.stdout.strip()
    assert out.startswith("SlurmUnavailable"), (out, proc.stderr[-2000:])
