"""Tests for ``hpcsched.slurm.observe``.

* Parsing tests on output captured from the dev cluster (Slurm 22.05.8, openapi v0.0.38),
  trimmed to the fields the parsers read, plus malformed inputs that must raise ``SlurmError``.
* CLI-backend tests with fake ``squeue``/``sinfo`` executables on ``PATH`` (no Slurm needed).
* Contract tests (``@pytest.mark.slurm``) that every usable backend must pass on the dev cluster;
  the pyslurm case is skipped with ``pyslurm_usable()``'s reason where pyslurm cannot run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcsched.slurm.observe import (
    Backend,
    BackendUnusable,
    Observation,
    PyslurmBackend,
    SlurmCLIBackend,
    expand_hostlist,
    gres_count,
    make_backend,
    parse_sinfo_json,
    parse_squeue_output,
    pyslurm_usable,
)
from hpcsched.slurm import SlurmError, SlurmUnavailable
from hpcsched.policies.snapshot import NodeView

from tests.conftest import wait_for

# --------------------------------------------------------------------------------------------
# Captured output (Slurm 22.05.8 dev cluster, 4 nodes x gpu:4), trimmed to the fields used
# --------------------------------------------------------------------------------------------

_META = '{"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}, "Slurm": {"release": "22.05.8"}}'

# `sinfo --json` with nothing running: gres_used is "gpu:0", tres_used is null.
SINFO_IDLE = '{"meta": ' + _META + ''', "errors": [], "nodes": [
  {"name": "n1", "hostname": "n1", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n2", "hostname": "n2", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n3", "hostname": "n3", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n4", "hostname": "n4", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null}
]}'''

# `sinfo --json` with job 61 (`sbatch -N2 --gres=gpu:2 --wrap 'sleep 30'`) on n[1-2] beside a
# foreign job 59 (gres:gpu:2 on n[1-3]): gres_used sums both, "gpu:4", with no (IDX:...) suffix.
SINFO_RUNNING = '{"meta": ' + _META + ''', "errors": [], "nodes": [
  {"name": "n1", "hostname": "n1", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:4", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=3,gres/gpu=4"},
  {"name": "n2", "hostname": "n2", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:4", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=3,gres/gpu=4"},
  {"name": "n3", "hostname": "n3", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:2", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=2,gres/gpu=2"},
  {"name": "n4", "hostname": "n4", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null}
]}'''

# `squeue --json` at the same moment: the foreign job, a held job, and ours.
SQUEUE_RUNNING = '{"meta": ' + _META + ''', "errors": [], "jobs": [
  {"job_id": 59, "job_state": "RUNNING", "state_reason": "None", "name": "digits_mlp.py", "user_name": "root", "partition": "gpu", "nodes": "n[1-3]", "node_count": 3, "tres_per_node": "gres:gpu:2", "gres_detail": ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"], "restart_cnt": 1, "batch_host": "n1", "priority": 4294901720},
  {"job_id": 60, "job_state": "PENDING", "state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "", "node_count": 1, "tres_per_node": "", "gres_detail": [], "restart_cnt": 0, "batch_host": "", "priority": 0},
  {"job_id": 61, "job_state": "RUNNING", "state_reason": "None", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "n[1-2]", "node_count": 2, "tres_per_node": "gres:gpu:2", "gres_detail": ["gpu:2(IDX:2-3)", "gpu:2(IDX:2-3)"], "restart_cnt": 0, "batch_host": "n1", "priority": 4294901719}
]}'''

# `squeue --json` after `scancel 60 61`: finished jobs stay listed (MinJobAge).
SQUEUE_CANCELLED = '{"meta": ' + _META + ''', "errors": [], "jobs": [
  {"job_id": 60, "job_state": "CANCELLED", "state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "", "node_count": 1, "tres_per_node": "", "gres_detail": [], "restart_cnt": 0, "batch_host": "", "priority": 0},
  {"job_id": 61, "job_state": "CANCELLED", "state_reason": "None", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "n[1-2]", "node_count": 2, "tres_per_node": "gres:gpu:2", "gres_detail": [], "restart_cnt": 0, "batch_host": "n1", "priority": 4294901719}
]}'''

# What 22.05.8 prints, with exit status 0 and nothing on stderr, when slurmctld does not answer
# (SlurmctldPort pointing at a closed port; after about 9 s of retries).
SQUEUE_DOWN = '{"meta": ' + _META + ''', "errors": [{"description": "Failed while looking for jobs", "error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}'''
SINFO_DOWN = '{"meta": ' + _META + ''', "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}'''


def _node(name="n1", **kw) -> dict:
    d = {"name": name, "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0",
         "partitions": ["gpu"]}
    d.update(kw)
    return d


def _sinfo(*nodes: dict) -> str:
    return json.dumps({"meta": {}, "errors": [], "nodes": list(nodes)})


# --------------------------------------------------------------------------------------------
# sinfo parsing
# --------------------------------------------------------------------------------------------


def test_sinfo_idle():
    nodes = parse_sinfo_json(SINFO_IDLE)
    assert nodes == tuple(NodeView(f"n{k}", 4, 0, "idle", ("gpu",)) for k in range(1, 5))
    assert all(n.usable and n.gpus_free == 4 for n in nodes)


def test_sinfo_running_job():
    nodes = {n.name: n for n in parse_sinfo_json(SINFO_RUNNING)}
    assert [nodes[n].gpus_allocated for n in ("n1", "n2", "n3", "n4")] == [4, 4, 2, 0]
    assert nodes["n1"].state == "mixed" and nodes["n4"].state == "idle"
    assert nodes["n3"].gpus_free == 2


def test_sinfo_bytes_accepted():
    assert len(parse_sinfo_json(SINFO_IDLE.encode())) == 4


@pytest.mark.parametrize("state, flags, want", [
    ("idle", [], "idle"),
    ("idle", ["DRAIN"], "idle+drain"),             # sinfo's "drained"
    ("mixed", ["DRAIN"], "mixed+drain"),           # sinfo's "draining"
    ("down", ["NOT_RESPONDING"], "down+not_responding"),
    ("allocated", None, "allocated"),
    (["IDLE", "DRAIN"], None, "idle+drain"),       # later openapi versions: one list
    ("IDLE+DRAIN", [], "idle+drain"),              # scontrol / pyslurm form
    (None, None, "unknown"),
])
def test_sinfo_state_and_flags(state, flags, want):
    (n,) = parse_sinfo_json(_sinfo(_node(state=state, state_flags=flags)))
    assert n.state == want
    assert n.usable == (want in ("idle", "allocated"))


def test_sinfo_node_listed_per_partition_is_merged():
    text = _sinfo(_node("n1", partitions=["gpu"]), _node("n2"),
                  _node("n1", partitions=["debug", "gpu"]))
    nodes = parse_sinfo_json(text)
    assert [n.name for n in nodes] == ["n1", "n2"]
    assert nodes[0].partitions == ("gpu", "debug")


def test_sinfo_missing_optional_fields_default():
    (n,) = parse_sinfo_json(_sinfo({"name": "x1"}))
    assert n == NodeView("x1", 0, 0, "unknown", ())
    (n,) = parse_sinfo_json(_sinfo({"hostname": "x2", "partitions": "a,b"}))
    assert n.name == "x2" and n.partitions == ("a", "b")


def test_sinfo_gres_used_missing_falls_back_to_tres_used():
    (n,) = parse_sinfo_json(_sinfo(_node(gres_used=None, tres_used="cpu=2,gres/gpu=3")))
    assert n.gpus_allocated == 3


@pytest.mark.parametrize("gres, want", [
    ("gpu:4", 4),
    ("gpu:0", 0),
    ("gpu:2(IDX:0-1)", 2),
    ("gpu:2(IDX:0,2)", 2),                     # comma inside the index list
    ("gpu:a100:4", 4),
    ("gpu:a100:4(S:0-1)", 4),
    ("gpu:a100:2,gpu:v100:1(IDX:3)", 3),
    ("gpu:(null):0(IDX:N/A)", 0),
    ("gpu:(null):3(IDX:0-2)", 3),
    ("gres:gpu:4", 4),
    ("gres/gpu=4", 4),
    ("mps:100,gpu:2", 2),
    ("shard:8", 0),
    ("gpu", 1),
    ("gpu:a100", 1),
    ("(null)", 0),
    ("N/A", 0),
    ("", 0),
    (None, 0),
])
def test_gres_count(gres, want):
    assert gres_count(gres) == want


@pytest.mark.parametrize("bad", [5, ["gpu:4"], "gpu:a100:four"])
def test_gres_count_rejects_garbage(bad):
    with pytest.raises(SlurmError):
        gres_count(bad)


@pytest.mark.parametrize("text, what", [
    (SINFO_IDLE[: len(SINFO_IDLE) // 2], "valid JSON"),   # truncated
    ("", "valid JSON"),
    ('{"nodes": 5}', "should be a list"),
    ('{"meta": {}, "errors": []}', "no 'nodes'"),
    ("[]", "JSON object"),
    ('{"nodes": [5]}', "should be an object"),
    ('{"nodes": [{"state": "idle"}]}', "no name"),
    ('{"nodes": [{"name": "n1", "gres": 4}]}', "GRES"),
    ('{"nodes": [{"name": "n1", "gres": "gpu:x:y"}]}', "whole number"),
    ('{"nodes": [{"name": "n1", "state_flags": "DRAIN"}]}', "state_flags"),
    ('{"nodes": [{"name": "n1", "state": 3}]}', "state"),
    ('{"nodes": [{"name": "n1", "partitions": [1, 2]}]}', "partitions"),
    ('{"errors": [{"error": "Access denied", "errno": 2010}], "nodes": []}', "Access denied"),
])
def test_sinfo_malformed_raises_slurm_error(text, what):
    with pytest.raises(SlurmError, match=what) as ei:
        parse_sinfo_json(text)
    assert not isinstance(ei.value, SlurmUnavailable)


# --------------------------------------------------------------------------------------------
# squeue parsing (hpcsched.slurm.parse_squeue_json behind a shape check)
# --------------------------------------------------------------------------------------------


def test_squeue_running_and_held():
    jobs = parse_squeue_output(SQUEUE_RUNNING)
    assert set(jobs) == {"59", "60", "61"}
    run, held = jobs["61"], jobs["60"]
    assert (run.state, run.nodes, run.node_count, run.gpus_per_node) == ("RUNNING", "n[1-2]", 2, 2)
    assert (held.state, held.state_reason, held.nodes, held.gpus_per_node) == (
        "PENDING", "JobHeldUser", "", 0)
    assert jobs["59"].restarts == 1


def test_squeue_finished_jobs_listed():
    jobs = parse_squeue_output(SQUEUE_CANCELLED)
    assert {j.state for j in jobs.values()} == {"CANCELLED"}
    assert not any(j.active for j in jobs.values())


@pytest.mark.parametrize("text", [
    SQUEUE_RUNNING[:-40],                      # truncated
    "",
    "not json",
    '{"jobs": 5}',
    '{"jobs": {"a": 1}}',
    '{"jobs": ["x"]}',                          # AttributeError inside parse_squeue_json alone
    '{"jobs": [{"name": "no id"}]}',
    '{"jobs": [{"job_id": 1, "node_count": "many"}]}',
    '{"jobs": [{"job_id": 1, "tres_per_node": 5}]}',
    '{"meta": {}}',
    "[1, 2]",
])
def test_squeue_malformed_raises_slurm_error(text):
    with pytest.raises(SlurmError):
        parse_squeue_output(text)


@pytest.mark.parametrize("parse, text", [(parse_squeue_output, SQUEUE_DOWN),
                                         (parse_sinfo_json, SINFO_DOWN)])
def test_controller_down_output_is_unavailable_not_empty(parse, text):
    """22.05 exits 0 with errors and an empty list when slurmctld does not answer."""
    with pytest.raises(SlurmUnavailable, match="Unspecified error"):
        parse(text)


# --------------------------------------------------------------------------------------------
# Hostlists
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, want", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1-2,4],m7", ["n1", "n2", "n4", "m7"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("", []),
])
def test_expand_hostlist(expr, want):
    assert expand_hostlist(expr) == want


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_bad(bad):
    with pytest.raises(SlurmError):
        expand_hostlist(bad)


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
    t0 = time.time()
    obs = b.observe()
    assert isinstance(obs, Observation)
    assert t0 <= obs.time <= time.time()
    assert obs.calls == 2 and b.calls == 2
    assert sorted(fake_slurm.calls()) == ["--json", "--json"]
    assert obs.jobs["61"].state == "RUNNING" and obs.node("n2").gpus_allocated == 4
    with pytest.raises(TypeError):
        obs.jobs["x"] = None  # read-only mapping
    b.observe()
    assert b.calls == 4


def test_cli_backend_partitions_filter(fake_slurm):
    fake_slurm.install("squeue", _serve(SQUEUE_RUNNING))
    fake_slurm.install("sinfo", _serve(_sinfo(_node("a1", partitions=["gpu"]),
                                              _node("b1", partitions=["cpu"]),
                                              _node("c1", partitions=["cpu", "debug"]))))
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
    obs = b.observe()
    assert obs.calls == 2 and b.calls == 2 and b.name == "pyslurm"
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
    proc = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args],
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
    proc = subprocess.run([sys.executable, "-c", _OBSERVE_ONCE, kind, str(timeout)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURM_CONF": str(conf)})
    out = proc.stdout.strip()
    assert out.startswith("SlurmUnavailable"), (out, proc.stderr[-2000:])
