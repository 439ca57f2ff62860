"""The launcher without Slurm: its pure parts (effective_config, master_port), the environment
contract it hands the workers (LaunchEnv, names unchanged), the launcher.json it writes, and
the one error policy of the in-job ``scontrol update``."""

from __future__ import annotations

import json
import logging
import math
import socket
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.job import allocation
from hpcsched.job.launcher import (
    LaunchConfig,
    Launcher,
    effective_config,
    master_port,
    port_is_free,
    port_range,
)
from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig, BatchSizeError
from hpcsched.protocol.env import LaunchEnv, ProcessEnv, variables
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import LauncherPhase
from hpcsched.protocol.limits import JobLimits

LIMITS = {"workers_per_node": 2, "min_nodes": 1, "max_nodes": 3, "min_batch_size": 32,
          "max_batch_size": 192, "max_local_batch_size": None, "base_batch_size": 64,
          "lr_scaling": "linear"}


def _spec(job_uid: str = "uid", **limits) -> JobSpec:
    return JobSpec(job_uid=job_uid, script="/s/train.py", script_args=("--epochs", "3"),
                   python="/usr/bin/python3", submit_dir="/s", sbatch_args=(), nodes=2,
                   limits=JobLimits(**{**LIMITS, **limits}), checkpoint_dir="/c",
                   checkpoint_interval=30.0, record_samples=True)


def _control(nodes: int, local: int, accum: int = 1, generation: int = 3) -> ctl.Control:
    return ctl.Control(job_uid="uid", generation=generation, action="checkpoint-and-requeue",
                       nodes=nodes, workers_per_node=2, global_batch_size=nodes * 2 * local * accum,
                       local_batch_size=local, accumulation_steps=accum, lr_scale=1.0,
                       issued_at=0.0)


# ---------------------------------------------------------------------- effective_config

@pytest.mark.parametrize("limits,control,nodes,want", [
    # first start: the submitted batch size, split over the real world size
    ({}, None, 2, LaunchConfig(0, 2, 2, BatchConfig(4, 16, 1), 1.0)),
    ({}, None, 1, LaunchConfig(0, 1, 2, BatchConfig(2, 32, 1), 1.0)),
    # the control's world size is the allocation's: its batch configuration as is
    ({}, _control(2, 16, accum=2), 2, LaunchConfig(3, 2, 2, BatchConfig(4, 16, 2), 2.0)),
    # Slurm gave 2 nodes, not 3: 126 refitted to 4 GPUs -> 32 each (round(31.5) = 32)
    ({}, _control(3, 21), 2, LaunchConfig(3, 2, 2, BatchConfig(4, 32, 1), 2.0)),
    ({"max_local_batch_size": 16}, _control(3, 21), 2,
     LaunchConfig(3, 2, 2, BatchConfig(4, 16, 2), 2.0)),
    # refitted within the limits: 300 asked, at most 192
    ({}, _control(3, 50), 2, LaunchConfig(3, 2, 2, BatchConfig(4, 48, 1), 3.0)),
    ({"lr_scaling": "sqrt"}, _control(2, 32), 2,
     LaunchConfig(3, 2, 2, BatchConfig(4, 32, 1), math.sqrt(2.0))),
])
def test_effective_config(limits, control, nodes, want):
    got = effective_config(_spec(**limits), control, nodes)
    assert got == want
    assert got.world_size == nodes * 2


def test_effective_config_refuses_a_world_size_no_batch_size_fits():
    with pytest.raises(BatchSizeError, match="no global batch size fits"):
        effective_config(_spec(), None, 100)   # 200 GPUs, at most 192 samples


# ---------------------------------------------------------------------------- master_port

def test_master_port_by_hand():
    assert master_port("1234", 1, ports=(20000, 50000)) \
        == 20000 + (1234 * 7919 + 104729) % 30000 == 26775
    assert master_port("1234", 1, ports=(20000, 32768)) \
        == 20000 + (1234 * 7919 + 104729) % 12768 == 27111


def test_master_port_is_in_range_and_new_for_every_launch_of_a_job():
    first, end = port_range()
    for job in ("1", "77", "999999"):
        ports = [master_port(job, launch) for launch in range(1, 201)]
        assert all(first <= p < end for p in ports)
        assert len(set(ports)) == len(ports)
    assert master_port("77", 3) == master_port("77", 3)


@pytest.mark.parametrize("content, want", [
    ("32768\t60999\n", (20000, 32768)),   # Linux's default: stay below the ephemeral ports
    ("20500 60999", (20000, 50000)),        # too few ports below: the old range
    ("garbage", (20000, 50000)),
])
def test_port_range_stays_below_the_kernel_ephemeral_ports(tmp_path, content, want):
    f = tmp_path / "ip_local_port_range"
    f.write_text(content)
    assert port_range(str(f)) == want
    assert port_range(str(tmp_path / "missing")) == (20000, 50000)


def test_master_port_skips_a_port_another_process_listens_on():
    """The CI failure this guards against: rank 0's TCPStore died with EADDRINUSE."""
    taken = master_port("4242", 5)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", taken))
        except OSError:
            pytest.skip(f"port {taken} is already in use on this machine")
        s.listen()
        assert not port_is_free(taken)
        got = master_port("4242", 5, port_is_free)
        assert got != taken and port_is_free(got)
    assert port_is_free(taken)
    assert master_port("4242", 5, port_is_free) == taken


# ------------------------------------------------------------------------------ LaunchEnv

#: the variables running jobs and their scripts read: the names must never change
LAUNCH_VARIABLES = {
    "job_dir": "HPCSCHED_JOB_DIR", "launch": "HPCSCHED_LAUNCH",
    "generation": "HPCSCHED_GENERATION", "nodes": "HPCSCHED_NODES",
    "workers_per_node": "HPCSCHED_WORKERS_PER_NODE", "world_size": "HPCSCHED_WORLD_SIZE",
    "local_batch_size": "HPCSCHED_LOCAL_BATCH_SIZE",
    "accumulation_steps": "HPCSCHED_ACCUMULATION_STEPS",
    "global_batch_size": "HPCSCHED_GLOBAL_BATCH_SIZE", "lr_scale": "HPCSCHED_LR_SCALE",
    "checkpoint_dir": "HPCSCHED_CHECKPOINT_DIR",
    "checkpoint_interval": "HPCSCHED_CHECKPOINT_INTERVAL",
    "record_samples": "HPCSCHED_RECORD_SAMPLES", "python": "HPCSCHED_PYTHON",
    "inplace_shrink": "HPCSCHED_INPLACE_SHRINK", "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT", "extensions": "HPCSCHED_EXTENSIONS",
    "join_generation": "HPCSCHED_JOIN_GENERATION", "fault_timeout": "HPCSCHED_FAULT_TIMEOUT",
    "mtbf": "HPCSCHED_MTBF",
}


def test_variable_names_are_unchanged():
    assert variables(LaunchEnv) == LAUNCH_VARIABLES
    assert variables(ProcessEnv) == {
        "rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
        "restart": "SLURM_RESTART_COUNT", "slurm_job_id": "SLURM_JOB_ID",
        "grad_noise": "HPCSCHED_GRAD_NOISE"}


@pytest.mark.parametrize("launch", [
    LaunchEnv(),
    LaunchEnv(job_dir="/jobs/abc", launch=2, generation=5, nodes=3, workers_per_node=4,
              world_size=12, local_batch_size=7, accumulation_steps=3, global_batch_size=252,
              lr_scale=1 / 3, checkpoint_dir="/ck", checkpoint_interval=12.5,
              record_samples=True, python="/venv/bin/python", inplace_shrink=True,
              master_addr="10.1.2.3", master_port=31337),
    LaunchEnv(lr_scale=math.sqrt(2.0) * 1e-9, checkpoint_interval=0.1),
])
def test_launch_env_round_trip(launch):
    env = launch.to_env()
    assert all(isinstance(v, str) for v in env.values())
    assert LaunchEnv.from_env(env) == launch


def test_a_script_outside_hpcsched_sees_the_defaults():
    assert LaunchEnv.from_env({}) == LaunchEnv()
    assert LaunchEnv.from_env({"HPCSCHED_LOCAL_BATCH_SIZE": ""}).local_batch_size is None
    assert ProcessEnv.from_env({}) == ProcessEnv(rank=0, world_size=1, local_rank=0, restart=0,
                                                 slurm_job_id="", grad_noise=True)


@pytest.mark.parametrize("cls,name,value,want", [
    (LaunchEnv, "HPCSCHED_RECORD_SAMPLES", "1", True),
    (LaunchEnv, "HPCSCHED_RECORD_SAMPLES", "0", False),
    (LaunchEnv, "HPCSCHED_RECORD_SAMPLES", "yes", False),      # only "1" turns it on
    (LaunchEnv, "HPCSCHED_INPLACE_SHRINK", "1", True),
    (ProcessEnv, "HPCSCHED_GRAD_NOISE", "0", False),           # only "0" turns it off
    (ProcessEnv, "HPCSCHED_GRAD_NOISE", "1", True),
    (ProcessEnv, "HPCSCHED_GRAD_NOISE", "no", True),
    (ProcessEnv, "HPCSCHED_GRAD_NOISE", "", True),
])
def test_flags_parse_as_before(cls, name, value, want):
    field = {v: k for k, v in variables(cls).items()}[name]
    assert getattr(cls.from_env({name: value}), field) is want


def test_a_number_that_does_not_parse_is_an_error():
    with pytest.raises(ValueError):
        LaunchEnv.from_env({"HPCSCHED_GENERATION": "two"})


# ------------------------------------------------------------------- Launcher, no Slurm

@pytest.fixture
def launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    jd = JobDir.create(tmp_path)
    jd.write_spec(_spec(jd.uid))
    return Launcher(jd.path)


def test_the_workers_environment(launcher):
    launcher.launches = 3
    cfg = effective_config(launcher.spec, None, 2)
    env = launcher.launch_env(cfg, "10.0.0.1").to_env()
    assert env == {
        "HPCSCHED_JOB_DIR": str(launcher.jd.path), "HPCSCHED_LAUNCH": "3",
        "HPCSCHED_GENERATION": "0", "HPCSCHED_NODES": "2", "HPCSCHED_WORKERS_PER_NODE": "2",
        "HPCSCHED_WORLD_SIZE": "4", "HPCSCHED_LOCAL_BATCH_SIZE": "16",
        "HPCSCHED_ACCUMULATION_STEPS": "1", "HPCSCHED_GLOBAL_BATCH_SIZE": "64",
        "HPCSCHED_LR_SCALE": "1.0", "HPCSCHED_CHECKPOINT_DIR": "/c",
        "HPCSCHED_CHECKPOINT_INTERVAL": "30.0", "HPCSCHED_RECORD_SAMPLES": "1",
        "HPCSCHED_PYTHON": "/usr/bin/python3", "HPCSCHED_INPLACE_SHRINK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(master_port("4242", 3)),
        "HPCSCHED_EXTENSIONS": "1", "HPCSCHED_JOIN_GENERATION": "0",
        "HPCSCHED_FAULT_TIMEOUT": "30.0", "HPCSCHED_MTBF": "0.0",
    }


def test_launcher_state_is_written_versioned_and_read_back(launcher):
    launcher.launches, launcher.resizes = 2, 1
    cfg = effective_config(launcher.spec, None, 2)
    launcher._save_state(LauncherPhase.RUNNING, cfg)
    obj = json.loads(launcher.jd.launcher_path.read_text())
    assert (obj["schema"], obj["job_uid"], obj["phase"]) == (
        "hpcsched.launcher/1", launcher.jd.uid, "running")
    st = launcher.jd.read_launcher_state()
    assert (st.job_id, st.launches, st.resizes, st.restarts, st.nodelist) == (
        "4242", 2, 1, 1, "n[1-2]")
    assert (st.generation, st.nodes, st.world_size, st.global_batch_size) == (0, 2, 4, 64)
    launcher._save_state(LauncherPhase.RESIZING, target_nodes=1)
    st = launcher.jd.read_launcher_state()
    assert st.phase.in_transition and st.target_nodes == 1 and st.world_size is None
    assert Launcher(launcher.jd.path).launches == 2   # a requeued run counts on


def test_a_launcher_state_from_an_older_launcher_is_unknown(launcher, caplog):
    launcher.jd.launcher_path.write_text(json.dumps(
        {"job_id": "4242", "launches": 5, "resizes": 0, "restarts": 0, "phase": "running",
         "time": 1.0, "nodelist": "n1"}))
    with caplog.at_level(logging.WARNING):
        again = Launcher(launcher.jd.path)
    assert again.launches == 0
    assert "launcher state unknown" in caplog.text and "schema None" in caplog.text


# ------------------------------------------------------- scontrol update from inside the job

@pytest.mark.parametrize("error", [None, slurm.SlurmError("scontrol update JobId=7: Invalid job id")])
def test_shrink_from_inside_runs_in_the_job_directory_and_never_raises(tmp_path, monkeypatch,
                                                                      error, caplog):
    calls = []

    def update_job(job_id, timeout, cwd=None, **fields):
        calls.append((job_id, fields, Path(cwd).resolve()))
        if error is not None:
            raise error

    monkeypatch.setattr(slurm, "update_job", update_job)
    monkeypatch.setattr(slurm, "job_info", lambda job_id: None)   # no NodeList= to fall back on
    before = Path.cwd()
    with caplog.at_level(logging.ERROR):
        got = allocation.shrink_from_inside("7", 2, tmp_path)
    assert calls == [("7", {"NumNodes": 2}, tmp_path.resolve())]  # where Slurm writes the script
    assert Path.cwd() == before, "the process's own directory is never changed"
    if error is None:
        assert got is None and not caplog.records
    else:
        assert got == str(error) and "NumNodes=2 failed" in caplog.text


def test_shrink_from_inside_asks_for_the_nodes_kept_when_numnodes_is_refused(tmp_path,
                                                                            monkeypatch):
    # Slurm 24.11+: NumNodes= refused for a running --ntasks-per-node job, NodeList= taken
    calls = []

    def update_job(job_id, timeout, cwd=None, **fields):
        calls.append(fields)
        if "NumNodes" in fields:
            raise slurm.SlurmError("scontrol update JobId=7: Job is no longer pending execution")

    monkeypatch.setattr(slurm, "update_job", update_job)
    monkeypatch.setattr(slurm, "job_info", lambda job_id: slurm.JobInfo(
        job_id="7", name="", user="u", state="RUNNING", state_reason="None", partition="gpu",
        nodes="n[1-3]", node_count=3, gpus_per_node=2, restarts=0, batch_host="n1", priority=1))
    assert allocation.shrink_from_inside("7", 2, tmp_path) is None
    assert calls == [{"NumNodes": 2}, {"NodeList": "n1,n2"}]    # the first nodes, as NumNodes keeps


def test_slurm_commands_run_in_the_directory_given(tmp_path):
    # scontrol writes the resize script into its working directory: cwd must reach the process
    assert slurm.run(["pwd"], cwd=tmp_path).strip() == str(tmp_path)
    assert Path(slurm.run(["pwd"]).strip()) == Path.cwd()


def test_launcher_relaunches_on_its_allocation_when_slurm_refuses_the_shrink(launcher,
                                                                             monkeypatch):
    def refuse(job_id, timeout, **fields):
        raise slurm.SlurmError("scontrol update JobId=4242: Requested operation not supported")

    monkeypatch.setattr(slurm, "update_job", refuse)
    launcher._shrink(1)    # no exception: the job goes on
    assert launcher.env["SLURM_JOB_NODELIST"] == "n[1-2]"
    assert launcher.jd.read_launcher_state().phase == LauncherPhase.RESIZING


def test_an_unreachable_controller_is_waited_for_not_fatal():
    """The launcher asks Slurm again while slurmctld is away (a restart under a running job);
    another error, or an outage longer than the wait, stands."""
    from hpcsched.job.launcher import _while_unreachable

    answers = [slurm.SlurmUnavailable("Unable to contact slurm controller"),
               slurm.SlurmUnavailable("Unable to contact slurm controller"), "127.0.0.3"]

    def call():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert _while_unreachable(call, "scontrol show node", wait=10, poll=0) == "127.0.0.3"

    def down():
        raise slurm.SlurmUnavailable("Unable to contact slurm controller")

    with pytest.raises(slurm.SlurmUnavailable):
        _while_unreachable(down, "scontrol show node", wait=0.05, poll=0.01)

    def refused():
        raise slurm.SlurmError("Invalid node name specified")

    with pytest.raises(slurm.SlurmError, match="Invalid node"):
        _while_unreachable(refused, "scontrol show node", wait=10, poll=0)


# ------------------------------------------------------- workers killed: a lost node

def _killed_then(launcher, monkeypatch, statuses, checkpoints=None):
    """Run the launcher with workers that end with ``statuses`` in turn; ``checkpoints[i]``
    names the newest checkpoint written during launch ``i`` (None: none new)."""
    from dataclasses import replace

    ck = launcher.jd.path / "ck"
    ck.mkdir()
    launcher.spec = replace(launcher.spec, checkpoint_dir=str(ck))
    monkeypatch.setattr(launcher, "_nodes", lambda: ["n1", "n2"])
    todo = list(statuses)
    launched = []

    def launch(cfg, nodes):
        launched.append(len(launched))
        name = (checkpoints or {}).get(len(launched) - 1)
        if name:
            (ck / "latest.json").write_text(json.dumps({"path": name, "step": 1, "time": 1.0}))
        return todo.pop(0)

    monkeypatch.setattr(launcher, "_launch", launch)
    return launcher.run(), len(launched)


def test_workers_killed_by_a_signal_are_launched_again_from_the_checkpoint(launcher, monkeypatch,
                                                                            caplog):
    with caplog.at_level(logging.WARNING):
        rc, launches = _killed_then(launcher, monkeypatch, [137, 0], {0: "step-000000040.pt"})
    assert (rc, launches) == (0, 2)
    assert "launching again from step-000000040.pt" in caplog.text
    assert launcher.jd.read_launcher_state().phase == LauncherPhase.FINISHED


def test_workers_killed_every_time_with_no_newer_checkpoint_end_the_job(launcher, monkeypatch,
                                                                        caplog):
    from hpcsched.job.launcher import LOST_RELAUNCHES

    rc, launches = _killed_then(launcher, monkeypatch, [137] * (LOST_RELAUNCHES + 1))
    assert (rc, launches) == (137, LOST_RELAUNCHES + 1)
    assert "giving up" in caplog.text
    assert launcher.jd.read_launcher_state().phase == LauncherPhase.FAILED


def test_a_newer_checkpoint_between_kills_starts_the_count_again(launcher, monkeypatch):
    from hpcsched.job.launcher import LOST_RELAUNCHES

    statuses = [137] * (LOST_RELAUNCHES + 2) + [0]
    rc, launches = _killed_then(launcher, monkeypatch, statuses,
                                {LOST_RELAUNCHES - 1: "step-000000090.pt"})
    assert (rc, launches) == (0, LOST_RELAUNCHES + 3)


@pytest.mark.parametrize("status", [0, 1, 2])
def test_workers_that_end_on_their_own_are_never_launched_again(launcher, monkeypatch, status):
    assert _killed_then(launcher, monkeypatch, [status]) == (status, 1)


def test_workers_killed_near_the_time_limit_requeue_the_job_instead(launcher, monkeypatch, caplog):
    """Slurm's pre-timeout signal goes to the workers' step once; workers launched again after
    it would never get it (seen in the chaos replay: the job was killed at its limit)."""
    asked = []
    monkeypatch.setattr(slurm, "time_left", lambda job_id, **_: "1:30")
    monkeypatch.setattr(slurm, "requeue", lambda job_id, **_: asked.append(job_id))
    launcher.requeue_timeout = 0.0   # Slurm would end this step; here the launcher goes on
    with caplog.at_level(logging.WARNING):
        rc, launches = _killed_then(launcher, monkeypatch, [137, 0], {0: "step-000000040.pt"})
    assert asked == ["4242"] and (rc, launches) == (0, 2)
    assert "within 120 s of the time limit: requeueing job 4242 to resume from step-000000040.pt" \
        in caplog.text


@pytest.mark.parametrize("text, seconds", [("1:30", 90), ("0:05", 5), ("2:03:04", 7384),
                                           ("1-00:00:10", 86410), (" 10:00 ", 600)])
def test_slurm_durations_read_as_seconds(text, seconds):
    from hpcsched.slurm.parse import duration_seconds

    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "UNLIMITED", "1:2:3:4", "a:b", "-1:00"])
def test_what_is_no_slurm_duration_is_refused(text):
    from hpcsched.slurm.parse import duration_seconds

    with pytest.raises(ValueError):
        duration_seconds(text)
