"""Tests for hpcsched.slurm.devcluster.

Pure tests (config rendering, root check, install errors, zombie handling, down/status when down)
run anywhere. Tests marked ``slurm`` start the real dev cluster as root when it is not up, in
``$HPCSCHED_DEVCLUSTER_DIR`` or ``/var/lib/hpcsched/devcluster``, and leave it up: other test
modules share it, so nothing here ever calls ``down`` on it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hpcsched.slurm import devcluster as dc
from hpcsched.slurm.devcluster import chroot, cli, daemons, install, processes
from tests.conftest import wait_for

STATE = dc.default_state_dir()

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the dev cluster runs Slurm daemons as root")


def _conf_values(text: str) -> dict[str, list[str]]:
    """``Key=Value`` lines of a Slurm config file, by key (node lines keep the whole line)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


# ---------------------------------------------------------------------------------------------
# Pure tests
# ---------------------------------------------------------------------------------------------


def test_render_configs_nodes_ports_and_settings(tmp_path):
    files = dc.render_configs(tmp_path, nodes=3, gpus=2, cpus=6)
    assert set(files) == {"slurm.conf", "gres.conf", "cgroup.conf", "slurmdbd.conf"}
    conf = files["slurm.conf"]
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert nodes == [
        f"NodeName=n{k} NodeHostname=n{k} NodeAddr=127.0.0.{k} Port={17000 + k} CPUs=6 RealMemory=16000 "
        "Gres=gpu:2 State=UNKNOWN"
        for k in (1, 2, 3)
    ]
    assert "PartitionName=gpu Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO\n" in conf
    v = {k: vals[0] for k, vals in _conf_values(conf).items()}
    expected = {
        "ClusterName": "lab", "SlurmctldHost": "localhost(127.0.0.1)",
        "SlurmctldPort": "16817", "SlurmdPort": "16818", "AccountingStoragePort": "16819",
        "AccountingStorageType": "accounting_storage/slurmdbd", "AccountingStorageTRES": "gres/gpu",
        "MinJobAge": "300", "KillWait": "5", "JobRequeue": "1", "ReturnToService": "2",
        "SchedulerParameters": "permit_job_expansion", "SlurmdParameters": "config_overrides",
        "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
        "JobAcctGatherType": "jobacct_gather/linux", "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none", "JobCompType": "jobcomp/filetxt", "GresTypes": "gpu",
        "StateSaveLocation": f"{tmp_path}/state", "SlurmdPidFile": f"{tmp_path}/run/slurmd-%n.pid",
        "SlurmctldPidFile": f"{tmp_path}/run/slurmctld.pid", "JobCompLoc": f"{tmp_path}/log/jobcomp.txt",
    }
    assert {k: v.get(k) for k in expected} == expected
    assert "AuthInfo" not in v

    assert f"NodeName=n[1-3] Name=gpu File={tmp_path}/dev/gpu[0-1]\n" in files["gres.conf"]
    assert "AutoDetect=off" in files["gres.conf"]

    db = {k: vals[0] for k, vals in _conf_values(files["slurmdbd.conf"]).items()}
    assert db["DbdPort"] == "16819" and db["StoragePort"] == "16820"
    assert db["StorageType"] == "accounting_storage/mysql" and db["StorageLoc"] == "slurm_acct_db"
    assert db["PidFile"] == f"{tmp_path}/run/slurmdbd.pid"


def test_render_configs_single_node_and_no_gpus(tmp_path):
    one = dc.render_configs(tmp_path, nodes=1, gpus=1, cpus=2)
    assert "PartitionName=gpu Nodes=n1 " in one["slurm.conf"]
    assert f"NodeName=n1 Name=gpu File={tmp_path}/dev/gpu0\n" in one["gres.conf"]
    none = dc.render_configs(tmp_path, nodes=2, gpus=0, cpus=2)
    assert "Gres=" not in none["slurm.conf"]
    assert "Name=gpu" not in none["gres.conf"]


@pytest.mark.parametrize("geometry", [(0, 4, 8), (1025, 4, 8), (4, -1, 8), (4, 4, 0)])
def test_render_configs_rejects_bad_geometry(tmp_path, geometry):
    with pytest.raises(dc.DevClusterError, match="must be between"):
        dc.render_configs(tmp_path, *geometry)


def test_state_dir_slurm_conf_cannot_hold_is_refused(tmp_path):
    with pytest.raises(dc.DevClusterError, match="slurm.conf cannot hold"):
        dc.render_configs(tmp_path / "with space")


def test_slurm_env_points_at_state_dir(tmp_path):
    assert dc.slurm_env(tmp_path) == {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf"}


def test_default_state_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HPCSCHED_DEVCLUSTER_DIR", str(tmp_path))
    assert dc.default_state_dir() == tmp_path
    monkeypatch.delenv("HPCSCHED_DEVCLUSTER_DIR")
    assert dc.default_state_dir() == Path("/var/lib/hpcsched/devcluster")


def test_up_requires_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    state = tmp_path / "state"
    with pytest.raises(dc.DevClusterError, match="must run as root"):
        dc.up(state)
    assert not state.exists()  # refused before touching anything

    result = CliRunner().invoke(dc.devcluster, ["up", "--state-dir", str(state)])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "must run as root" in lines[0]


def test_no_install_with_missing_binary_is_a_clear_error(monkeypatch):
    real_bin = install.find_bin
    monkeypatch.setattr(install, "find_bin", lambda name: None if name == "slurmdbd" else real_bin(name))
    with pytest.raises(dc.DevClusterError, match=r"missing slurmdbd and --no-install given"):
        install.ensure_installed(install=False)


def test_failed_install_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(install, "find_bin", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    calls = []

    def fake_run(args, **kwargs):
        calls.append(args)
        raise dc.DevClusterError("`apt-get update` failed (exit 100): E: could not resolve deb.debian.org")

    monkeypatch.setattr(install, "run_cmd", fake_run)
    with pytest.raises(dc.DevClusterError, match=r"^installing slurm-wlm munge slurmdbd mariadb-server failed: "):
        install.ensure_installed(install=True)
    assert calls == [["/usr/bin/apt-get", "update"]]


def test_zombie_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while processes.proc_state(child.pid)[1] != "Z":  # exited, not yet reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not processes.alive(child.pid)
    finally:
        child.wait()
    assert processes.alive(os.getpid())
    assert not processes.alive(os.getpid(), comm="slurmctld")  # a reused PID is not our daemon


@pytest.mark.parametrize("mariadb", ["crashed", "crashed twice", "alive"])
def test_slurmdbd_is_started_once_more_only_when_mariadb_died_under_it(monkeypatch, tmp_path, mariadb):
    """MariaDB 10.11 crashed once in about 100 starts on slurmdbd's first table check
    (daemons.start_accounting): then both start again, once; a slurmdbd failure of its own, or
    a second crash, is the error it was."""
    layout = daemons.Layout(tmp_path)
    layout.run.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()   # reaped: its PID is not alive
    calls = []

    def start_mariadb(lay, port):
        calls.append("mariadb")
        pid = os.getpid() if mariadb == "alive" else dead.pid
        lay.pidfile("mariadb").write_text(f"{pid}\n")

    def start_daemon(lay, name, args, port, log):
        calls.append(name)
        if mariadb == "crashed twice" or calls.count(name) == 1:
            raise dc.DevClusterError("slurmdbd exited during start: ... Server has gone away")

    monkeypatch.setattr(daemons, "start_mariadb", start_mariadb)
    monkeypatch.setattr(daemons, "start_daemon", start_daemon)
    monkeypatch.setattr(daemons, "need_bin", lambda name: f"/usr/sbin/{name}")
    if mariadb == "crashed":
        daemons.start_accounting(layout, 1, 2)
        assert calls == ["mariadb", "slurmdbd", "mariadb", "slurmdbd"]
    else:
        with pytest.raises(dc.DevClusterError, match="Server has gone away"):
            daemons.start_accounting(layout, 1, 2)
        assert calls == (["mariadb", "slurmdbd"] * (2 if mariadb == "crashed twice" else 1))


@pytest.mark.parametrize("second", ["starts", "fails"])
def test_slurmdbd_that_failed_its_first_queries_is_started_once_more(monkeypatch, tmp_path, second):
    """slurmdbd exiting on its first queries to a running MariaDB ("Unable to initialize
    accounting_storage/mysql": seen once, four clusters starting at once) is started once more,
    MariaDB left as it runs; a second failure is the error it was."""
    layout = daemons.Layout(tmp_path)
    layout.run.mkdir(parents=True)
    calls = []

    def start_mariadb(lay, port):
        calls.append("mariadb")
        lay.pidfile("mariadb").write_text(f"{os.getpid()}\n")   # alive

    def start_daemon(lay, name, args, port, log):
        calls.append(name)
        if calls.count(name) == 1 or second == "fails":
            raise dc.DevClusterError("slurmdbd exited during start: ... error: We should have "
                                     "gotten a result: 'No error' '' | fatal: Unable to initialize "
                                     "accounting_storage/mysql accounting storage plugin")

    monkeypatch.setattr(daemons, "start_mariadb", start_mariadb)
    monkeypatch.setattr(daemons, "start_daemon", start_daemon)
    monkeypatch.setattr(daemons, "need_bin", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(daemons.time, "sleep", lambda s: calls.append(f"sleep {s:g}"))
    if second == "starts":
        daemons.start_accounting(layout, 1, 2)
    else:
        with pytest.raises(dc.DevClusterError, match="Unable to initialize"):
            daemons.start_accounting(layout, 1, 2)
    assert calls == ["mariadb", "slurmdbd", "sleep 2", "slurmdbd"]


def test_stopping_slurmd_kills_the_steps_it_left_and_no_other_clusters(tmp_path):
    """Two processes named ``slurmstepd`` (copies of bash(1)), each with a job process below it;
    one has this cluster's ``SLURM_CONF`` in its environment, as slurmd passes it on, one
    another cluster's: stopping the cluster's slurmd kills the first and its job only."""
    layout = daemons.Layout(tmp_path / "mine")
    stepd = tmp_path / "slurmstepd"
    stepd.write_bytes(Path("/bin/bash").read_bytes())
    stepd.chmod(0o755)
    procs = {name: subprocess.Popen([str(stepd), "-c", "sleep 300 & echo $!; wait"],
                                    env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
                                    stdout=subprocess.PIPE, text=True)
             for name, conf in (("mine", layout.slurm_conf),
                                ("other", tmp_path / "other" / "etc" / "slurm.conf"))}
    jobs = {name: int(p.stdout.readline()) for name, p in procs.items()}
    try:
        assert {p.pid for p in procs.values()} <= set(processes.find_procs("slurmstepd"))
        layout.run.mkdir(parents=True)
        processes.stop_all(layout)   # no daemon of its own: its steps alone are left
        assert procs["mine"].wait(timeout=10) == -9
        wait_for(lambda: not processes.alive(jobs["mine"]), 10, "the step's job to be killed")
        assert procs["other"].poll() is None and processes.alive(jobs["other"])
    finally:
        for name, p in procs.items():
            p.kill()
            p.wait()
            with contextlib.suppress(ProcessLookupError):
                os.kill(jobs[name], 9)


def test_down_and_status_when_down(tmp_path):
    state = tmp_path / "never-started"
    assert dc.down(state) is False
    assert dc.is_up(state) is False
    runner = CliRunner()
    assert runner.invoke(dc.devcluster, ["down", "--state-dir", str(state)]).exit_code == 0
    result = runner.invoke(dc.devcluster, ["status", "--json", "--state-dir", str(state)])
    assert result.exit_code == 3
    st = json.loads(result.stdout)
    assert st["up"] is False and st["nodes"] == [] and st["geometry"] is None
    assert runner.invoke(dc.devcluster, ["status", "--state-dir", str(state)]).exit_code == 3


def test_status_text_of_an_up_cluster(monkeypatch, tmp_path):
    st = {"up": True, "state_dir": str(tmp_path), "slurm_conf": f"{tmp_path}/etc/slurm.conf",
          "geometry": {"nodes": 2, "gpus": 4, "cpus": 8},
          "daemons": [{"name": "munged", "pid": 7, "running": True, "started_by_us": False},
                      {"name": "slurmctld", "pid": 9, "running": True, "started_by_us": True},
                      {"name": "slurmd-n2", "pid": None, "running": False, "started_by_us": True}],
          "nodes": [{"name": "n1", "state": "idle", "flags": [], "gres": "gpu:4", "cpus": 8, "reason": ""},
                    {"name": "n2", "state": "down", "flags": ["NOT_RESPONDING"], "gres": "", "cpus": 8,
                     "reason": "gone"}],
          "error": "sinfo: slow"}
    monkeypatch.setattr(cli, "status", lambda state_dir: st)
    result = CliRunner().invoke(dc.devcluster, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"dev cluster {tmp_path}: up (2 nodes x 4 GPUs x 8 CPUs)",
        "  munged       running, pid 7 (not started by devcluster)",
        "  slurmctld    running, pid 9",
        "  slurmd-n2    not running",
        "nodes:",
        "  n1     idle         gres=gpu:4 cpus=8",
        "  n2     down+NOT_RESPONDING gres=- cpus=8  (gone)",
        "sinfo: sinfo: slow",
        f"export SLURM_CONF={tmp_path}/etc/slurm.conf",
    ]


# ---------------------------------------------------------------------------------------------
# Against the real cluster (left up at the end)
# ---------------------------------------------------------------------------------------------


def _slurm(env: dict[str, str], *args: str, timeout: float = 10) -> str:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout,
                          check=True).stdout


# ---------------------------------------------------------------------------------------------
# Pure tests of the chroot clusters (--slurm 24.11 | 26.05)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", list(chroot.VERSIONS))
def test_chroot_configs_own_ports_no_slurmdbd_no_cgroup(tmp_path, version):
    ports = chroot.VERSIONS[version].ports
    files = dc.render_configs(tmp_path, nodes=2, gpus=4, cpus=8, ports=ports)
    v = {k: vals[0] for k, vals in _conf_values(files["slurm.conf"]).items()}
    assert (v["SlurmctldPort"], v["SlurmdPort"]) == (str(ports.slurmctld), str(ports.slurmd))
    assert v["AccountingStorageType"] == "accounting_storage/none"
    assert "AccountingStorageTRES" not in v and "AccountingStoragePort" not in v   # 24.11: TRES needs slurmdbd
    nodes = [line for line in files["slurm.conf"].splitlines() if line.startswith("NodeName=")]
    assert [re.search(r"Port=(\d+)", n).group(1) for n in nodes] == [str(ports.node(1)), str(ports.node(2))]
    assert "CgroupPlugin=disabled" in files["cgroup.conf"]
    assert "JobSubmitPlugins" not in v and "Prolog" not in v   # no lua, no hpcsched hooks there


def test_host_cluster_wires_the_plugins_off_until_turned_on(tmp_path):
    from hpcsched.slurm.devcluster import plugins
    from hpcsched.slurm.devcluster.base import Layout

    layout = Layout(tmp_path)
    v = {k: vals[0] for k, vals in _conf_values(dc.render_configs(tmp_path)["slurm.conf"]).items()}
    assert (v["JobSubmitPlugins"], v["Prolog"], v["Epilog"]) == (
        "lua", f"{layout.etc}/prolog", f"{layout.etc}/epilog")
    with pytest.raises(dc.DevClusterError, match="devcluster up"):
        plugins.set_plugins(tmp_path, True)    # never started here
    layout.etc.mkdir(parents=True)
    plugins.write_plugin_hooks(layout)
    lua = layout.etc / "job_submit.lua"
    assert "every job passes" in lua.read_text()
    off = subprocess.run(["sh", str(layout.etc / "prolog")], capture_output=True, text=True)
    assert off.returncode == 0 and off.stdout == ""       # off: a no-op

    plugins.set_plugins(tmp_path, True)
    assert lua.read_text() == (plugins.plugins_dir() / "job_submit.lua").read_text()
    plugins.write_plugin_hooks(layout)                    # a restart keeps it on
    assert lua.read_text() == (plugins.plugins_dir() / "job_submit.lua").read_text()
    plugins.set_plugins(tmp_path, False)
    assert "every job passes" in lua.read_text()


def test_chroot_ports_meet_neither_the_host_cluster_nor_each_other():
    def used(p: dc.base.Ports) -> set[int]:
        return {p.slurmctld, p.slurmd, *(p.node(k) for k in range(1, dc.base.SMALL_NODES + 1))}

    host = used(dc.base.DEFAULT_PORTS) | {dc.base.SLURMDBD_PORT, dc.base.MARIADB_PORT}
    sets = [used(v.ports) for v in chroot.VERSIONS.values()]
    assert all(not (s & host) for s in sets)
    assert not (sets[0] & sets[1])


def test_instance_clusters_meet_no_other_cluster_nor_the_jobs_ports():
    """The clusters the test suite runs side by side (one per pytest-xdist worker) have ports of
    their own, below where jobs' rank-0 stores start, and job ids of their own."""
    from hpcsched.job.launcher import PORT_BASE

    def used(p: dc.base.Ports) -> set[int]:
        return ({p.slurmctld, p.slurmd, *(p.node(k) for k in range(1, dc.base.SMALL_NODES + 1))}
                | ({p.slurmdbd, p.mariadb} if p.accounting else set()))

    clusters = [dc.base.instance_ports(k) for k in range(dc.base.MAX_INSTANCE + 1)]
    sets = [used(p) for p in clusters] + [used(v.ports) for v in chroot.VERSIONS.values()]
    assert sum(len(s) for s in sets) == len(set().union(*sets)), "two clusters share a port"
    assert max(max(s) for s in sets) < PORT_BASE
    assert len({p.first_job_id for p in clusters}) == len(clusters)
    with pytest.raises(dc.DevClusterError, match="between 0 and"):
        dc.base.instance_ports(dc.base.MAX_INSTANCE + 1)


def test_a_large_cluster_puts_nodes_past_254_on_addresses_and_ports_of_their_own(tmp_path):
    """Up to n254 a node is at 127.0.0.K, port base + K, as always; past it (a scale cluster,
    ``--nodes 256``..1024) at other loopback addresses and at ports above the kernel's ephemeral
    range and the jobs' rank-0 stores, every one distinct."""
    from hpcsched.job.launcher import PORT_BASE, port_range

    conf = dc.render_configs(tmp_path, nodes=dc.base.MAX_NODES)["slurm.conf"]
    lines = [ln for ln in conf.splitlines() if ln.startswith("NodeName=")]
    assert len(lines) == dc.base.MAX_NODES
    addrs = [re.search(r"NodeAddr=(\S+)", ln).group(1) for ln in lines]
    ports = [int(re.search(r" Port=(\d+)", ln).group(1)) for ln in lines]
    assert len(set(addrs)) == len(addrs) and len(set(ports)) == len(ports)
    assert addrs[253] == "127.0.0.254" and ports[253] == 17254
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network("127.0.0.0/8") for a in addrs)
    large = ports[dc.base.SMALL_NODES:]
    assert min(large) > max(PORT_BASE, port_range()[1], 60999) and max(large) <= 65535
    assert f"Nodes=n[1-{dc.base.MAX_NODES}] " in conf


def test_an_instance_cluster_config_names_its_own_ports_and_first_job_id(tmp_path):
    p = dc.base.instance_ports(2)
    files = dc.render_configs(tmp_path, ports=p)
    conf = files["slurm.conf"]
    assert f"SlurmctldPort={p.slurmctld}\n" in conf and f"AccountingStoragePort={p.slurmdbd}\n" in conf
    assert "FirstJobId=200001\n" in conf and f"Port={p.node(4)} " in conf
    assert f"DbdPort={p.slurmdbd}\n" in files["slurmdbd.conf"]
    assert f"StoragePort={p.mariadb}\n" in files["slurmdbd.conf"]
    assert "FirstJobId" not in dc.render_configs(tmp_path)["slurm.conf"]


@pytest.mark.parametrize("text, want", [
    ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n", "http://mirror.example/debian"),
    ("deb http://deb.debian.org/debian bookworm main\n", "http://deb.debian.org/debian"),
    ("deb [arch=amd64] http://m.example/debian bookworm main\n", "http://m.example/debian"),
    ("URIs: http://deb.debian.org/debian-security\n", "http://deb.debian.org/debian"),  # not security
])
def test_apt_mirror(tmp_path, text, want):
    (tmp_path / "debian.sources").write_text(text)
    assert chroot.apt_mirror((str(tmp_path),)) == want


def test_unknown_version_is_refused():
    with pytest.raises(dc.DevClusterError, match="22.05, 24.11, 26.05"):
        chroot.chroot_dir("23.02")


@pytest.mark.parametrize("args, want", [
    ([], "/var/lib/hpcsched/devcluster-24.11"),                 # not $HPCSCHED_DEVCLUSTER_DIR (the host's)
    (["--state-dir", "/tmp/mine"], "/tmp/mine"),
])
def test_cli_slurm_option_state_dir(monkeypatch, args, want):
    seen = {}

    def fake_status(version, state_dir):
        seen.update(version=version, state_dir=str(state_dir))
        return {"up": False, "state_dir": str(state_dir), "slurm_conf": "x", "geometry": None, "daemons": [],
                "nodes": [], "error": None}

    monkeypatch.setattr(chroot, "status", fake_status)
    monkeypatch.setenv(dc.STATE_DIR_ENV, "/var/lib/hpcsched/devcluster")
    result = CliRunner().invoke(cli.devcluster, ["status", "--slurm", "24.11", *args])
    assert result.exit_code == 3, result.output
    assert seen == {"version": "24.11", "state_dir": want}


def test_client_wrappers(monkeypatch, tmp_path):
    monkeypatch.setattr(chroot, "CHROOTS_DIR", tmp_path / "chroots")
    bindir = chroot.write_client_wrappers("24.11", dc.base.Layout(tmp_path / "state"))
    assert bindir == tmp_path / "state" / "bin"
    for name in chroot.CLIENTS:
        assert os.readlink(bindir / name) == "slurm-client"
    text = (bindir / "slurm-client").read_text()
    assert f'"{tmp_path}/chroots/trixie/usr/bin/$n"' in text and os.access(bindir / "slurm-client", os.X_OK)


@pytest.mark.skipif(not os.path.exists("/usr/bin/sinfo"), reason="needs a host sinfo")
def test_client_wrapper_outside_the_chroot_runs_the_binary_of_that_name(monkeypatch, tmp_path):
    """Inside the chroot (a job's PATH) the chroot directory does not exist: plain /usr/bin/<name>."""
    monkeypatch.setattr(chroot, "CHROOTS_DIR", tmp_path / "nowhere")
    bindir = chroot.write_client_wrappers("26.05", dc.base.Layout(tmp_path / "state"))
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    out = subprocess.run([str(bindir / "sinfo"), "--version"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf")))
    assert out.returncode == 0 and out.stdout.startswith("slurm"), out


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_sinfo_nodes_reads_every_version(monkeypatch, version):
    recorded = (Path(__file__).parent / "data/slurm" / version / "sinfo.drain.json").read_text()
    monkeypatch.setattr(daemons, "run_cmd", lambda *a, **k: SimpleNamespace(stdout=recorded))
    rows = daemons.sinfo_nodes(Path("/x/slurm.conf"))
    assert [(r["name"], r["state"], r["flags"], r["gres"], r["cpus"]) for r in rows] == [
        ("n1", "mixed", [], "gpu:4", 8), ("n2", "mixed", ["DRAIN"], "gpu:4", 8)]
    assert [r["reason"] for r in rows][1] == "recorded"


@pytest.fixture(scope="module")
def cluster(devcluster):
    """The shared dev cluster (session fixture in conftest.py: started if down, stopped at the
    end only if this session started it)."""
    return SimpleNamespace(conf=devcluster, env=dict(os.environ, **dc.slurm_env(STATE)))


def _pids() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((STATE / "run").glob("*.pid"))}


@pytest.mark.slurm
@needs_root
def test_up_is_idempotent(cluster):
    before = _pids()
    t0 = time.monotonic()
    assert dc.up(STATE) == cluster.conf
    assert time.monotonic() - t0 < 5
    assert _pids() == before
    assert dc.is_up(STATE)

    result = CliRunner().invoke(dc.devcluster, ["up", "--state-dir", str(STATE)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"export SLURM_CONF={cluster.conf}\n"
    assert "already up" in result.stderr
    assert _pids() == before


@pytest.mark.slurm
@needs_root
def test_up_with_other_geometry_is_refused(cluster):
    before = _pids()
    with pytest.raises(dc.DevClusterError, match="already up with 4 nodes x 4 GPUs.*devcluster down"):
        dc.up(STATE, nodes=3)
    assert _pids() == before and dc.is_up(STATE)


@pytest.mark.slurm
@needs_root
def test_status_reports_four_idle_gpu_nodes(cluster):
    def all_idle():
        st = dc.status(STATE)
        return st if [n["state"] for n in st["nodes"]] == ["idle"] * 4 else None

    st = wait_for(all_idle, 60, "4 idle nodes")  # jobs of other test modules may still be finishing
    assert st["up"] and st["error"] is None
    assert st["geometry"] == {"nodes": 4, "gpus": 4, "cpus": 8}
    assert [(n["name"], n["gres"], n["cpus"]) for n in st["nodes"]] == [(f"n{k}", "gpu:4", 8) for k in (1, 2, 3, 4)]
    daemons = {d["name"]: d for d in st["daemons"]}
    for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3", "slurmd-n4", "munged"):
        assert daemons[name]["running"], name

    result = CliRunner().invoke(dc.devcluster, ["status", "--json", "--state-dir", str(STATE)])
    assert result.exit_code == 0
    assert [n["name"] for n in json.loads(result.stdout)["nodes"]] == ["n1", "n2", "n3", "n4"]


@pytest.fixture(scope="module")
def gpu_job(cluster, tmp_path_factory):
    """A 2-node, 4-GPU-per-node batch job, run to completion."""
    out_dir = tmp_path_factory.mktemp("devcluster-job")
    job_id = _slurm(
        cluster.env, "sbatch", "--parsable", "-N2", "--gres=gpu:4", f"--chdir={out_dir}",
        f"--output={out_dir}/job-%j.out", "--wrap", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES",
    ).strip().split(";")[0]

    def finished():
        state = _slurm(cluster.env, "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", timeout=5).strip()
        return state if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"} else None

    state = wait_for(finished, 60, f"job {job_id} to finish")  # the first job after start takes ~3 s
    return SimpleNamespace(id=job_id, state=state, output=out_dir / f"job-{job_id}.out")


@pytest.mark.slurm
@needs_root
def test_gpu_job_runs_on_two_nodes(gpu_job):
    assert gpu_job.state == "COMPLETED"
    assert re.fullmatch(r"n[1-4] 0,1,2,3\n", gpu_job.output.read_text())


@pytest.mark.slurm
@needs_root
def test_sacct_records_the_job(cluster, gpu_job):
    def accounted():
        line = _slurm(cluster.env, "sacct", "-j", gpu_job.id, "-X", "-n", "-P", "-o", "State,NNodes,AllocTRES").strip()
        return line if line.startswith("COMPLETED|") else None  # slurmdbd is written asynchronously

    _, nnodes, tres = wait_for(accounted, 30, f"sacct to show job {gpu_job.id} COMPLETED").split("|")
    assert nnodes == "2"
    assert "gres/gpu=8" in tres.split(",")


@pytest.mark.slurm
def test_mariadb_keeps_its_temporary_files_in_the_clusters_own_directory(devcluster):
    """Each dev cluster's MariaDB has a tmpdir of its own: two clusters initialised at the same
    second in a shared /tmp failed each other's bootstrap (a test run, 2026-11-30)."""
    from hpcsched.slurm.devcluster.base import Layout

    layout = Layout(dc.default_state_dir())
    pid = processes.read_pid(layout.pidfile("mariadb"))
    assert pid, "MariaDB runs"
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert f"--tmpdir={layout.db_tmp}" in args
    assert layout.db_tmp.is_dir() and (layout.db_tmp.stat().st_mode & 0o077) == 0


def test_a_daemon_that_outlives_sigkill_does_not_keep_the_others_running(tmp_path, monkeypatch):
    """slurmd still there after SIGKILL (seen: 256 of them in uninterruptible sleep on a stalled
    disk) is an error, but only once slurmctld, after it in the order, has been stopped too."""
    layout = daemons.Layout(tmp_path)
    layout.run.mkdir(parents=True)
    ctld = tmp_path / "slurmctld"
    ctld.write_bytes(Path("/bin/sleep").read_bytes())
    ctld.chmod(0o755)
    proc = subprocess.Popen([str(ctld), "300"])
    layout.pidfile("slurmctld").write_text(f"{proc.pid}\n")
    layout.pidfile("slurmd-n1").write_text(f"{os.getpid()}\n")   # any live process will do
    real = processes._stop_group

    def stop(group):
        if any(processes.daemon_kind(n) == "slurmd" for n in group):
            raise dc.DevClusterError("timed out after 30 s waiting for slurmd to die after SIGKILL")
        return real(group)

    monkeypatch.setattr(processes, "_stop_group", stop)
    try:
        with pytest.raises(dc.DevClusterError, match=r"slurmd to die .*\(the other daemons were stopped\)"):
            processes.stop_all(layout)
        assert proc.wait(timeout=30) is not None
        assert layout.pidfile("slurmd-n1").exists() and not layout.pidfile("slurmctld").exists()
    finally:
        proc.kill()
        proc.wait()
