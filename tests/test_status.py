"""``hpcsched status`` without Slurm: one job's row from its files and Slurm's answer (job_row),
the table cells, the JSON document, and the command with Slurm's answer given (collect)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcsched import slurm
from hpcsched.daemon import status
from hpcsched.daemon.status import JobStatus, job_row, table_cells
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.limits import JobLimits

ME = current_user()   # Slurm's user of the test jobs: they live in this user's subtree

JOB_ID = "42"


def info(state="RUNNING", nodes=2, gpus_per_node=0, **kw):
    fields = dict(job_id=JOB_ID, name="", user=ME, state=state, state_reason="None",
                  partition="gpu", nodes="n[1-2]" if nodes == 2 else "n1", node_count=nodes,
                  gpus_per_node=gpus_per_node, restarts=0, batch_host="n1", priority=1)
    return slurm.JobInfo(**{**fields, **kw})


@pytest.fixture
def jd(control_dir):
    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script="/home/alice/train.py", script_args=(),
                         python="python3", submit_dir="/home/alice", sbatch_args=(), nodes=2,
                         limits=JobLimits(2, 1, 4, 32, 512, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "checkpoints"), user="alice"))
    d.link_job_id(JOB_ID)
    return d


def ack(d, generation, state="applied", gbs=64, **kw):
    ctl.write_ack(d.ack_path, ctl.Ack(
        job_uid=d.uid, generation=generation, state=state, world_size=4, nodes=2,
        global_batch_size=gbs, local_batch_size=gbs // 4, accumulation_steps=1, step=10,
        time=1.0, **kw))


def control(d, generation, gbs, nodes=2, reason="idle GPUs"):
    ctl.write_control(d.control_path, ctl.Control(
        job_uid=d.uid, generation=generation, action="continue", nodes=nodes,
        workers_per_node=2, global_batch_size=gbs, local_batch_size=gbs // (2 * nodes),
        accumulation_steps=1, lr_scale=gbs / 64, issued_at=1.0, reason=reason))


def progress(d, finished=False):
    ctl.write_progress(d.progress_path, ctl.Progress(
        job_uid=d.uid, generation=0, step=10, epoch=1, samples_processed=640,
        epoch_position=0, throughput=123.4, world_size=4, global_batch_size=64, time=1.0,
        finished=finished))


# (files written, Slurm's answer, expected fields of the row, expected table cells GPUS..GEN)
ROWS = {
    "submitted, nothing written yet": (
        [], info(), dict(state="RUNNING", name="train.py", user=ME, gpus=4, nodes=2,
                         global_batch_size=64, generation=0), ("4", "64", "0")),
    "Slurm's GPUs per node win over the spec's": (
        [], info(gpus_per_node=4), dict(gpus=8), ("8", "64", "0")),
    "a batch change requested, not yet acknowledged": (
        [lambda d: control(d, 1, 128)], info(),
        dict(global_batch_size=64, target_global_batch_size=128, target_generation=1,
             target_nodes=2, last_reason="idle GPUs"), ("4", "64->128", "0/1")),
    "the change applied": (
        [lambda d: control(d, 1, 128), lambda d: ack(d, 1, gbs=128)], info(),
        dict(global_batch_size=128, generation=1, ack_state="applied"), ("4", "128", "1")),
    # a checkpointed (or rejected) ack reports the batch in force, not the submitted one
    "a shrink under way after a batch change": (
        [lambda d: control(d, 2, 256, nodes=1), lambda d: ack(d, 2, "checkpointed", gbs=128)],
        info(), dict(global_batch_size=128, generation=2, ack_state="checkpointed"),
        ("4", "128->256", "2")),
    "progress": (
        [progress], info(), dict(samples_processed=640, epoch=1, step=10, throughput=123.4),
        ("4", "64", "0")),
    "progress of a finished job: no throughput": (
        [lambda d: progress(d, finished=True)], info(state="COMPLETED"),
        dict(state="COMPLETED", throughput=0.0), ("4", "64", "0")),
    "Slurm has forgotten the job": (
        [], None, dict(state="GONE", gpus=0, nodelist=""), ("-", "64", "0")),
    "a broken ack is a problem, the other files still count": (
        [lambda d: d.ack_path.write_text("{"), lambda d: control(d, 1, 128)], info(),
        dict(global_batch_size=64, target_global_batch_size=128), ("4", "64->128", "0/1")),
    "a broken spec: the job is still listed": (
        [lambda d: d.spec_path.write_text("[]")], info(),
        dict(name="", user=ME, gpus=2, global_batch_size=None), ("2", "-", "0")),
}


@pytest.mark.parametrize("writes,slurm_info,fields,cells", ROWS.values(), ids=ROWS.keys())
def test_job_row(jd, writes, slurm_info, fields, cells):
    for write in writes:
        write(jd)
    row = job_row(JOB_ID, slurm_info)
    assert {k: getattr(row, k) for k in fields} == fields
    assert row.job_dir == str(jd.path)
    assert table_cells(row)[4:7] == cells
    broken = [p for p in (jd.ack_path, jd.spec_path) if p.exists() and p.read_text() in ("{", "[]")]
    assert [str(p) in " ".join(row.problems) for p in broken] == [True] * len(broken)
    assert len(row.problems) == len(broken)


def test_slurm_unanswered_leaves_the_state_unknown(jd):
    assert job_row(JOB_ID, None, slurm_answered=False).state == "UNKNOWN"


def test_a_job_without_a_directory(control_dir):
    row = job_row("999", info(job_id="999"))
    assert row.job_dir == "" and row.state == "UNKNOWN"
    assert len(row.problems) == 1 and "job 999 is not an hpcsched job" in row.problems[0]


def test_the_launcher_phase_shows_beside_a_running_state(jd):
    ctl.write_launcher_state(jd.launcher_path, ctl.LauncherState(
        job_uid=jd.uid, job_id=JOB_ID, phase="resizing", launches=2, resizes=1, restarts=0,
        time=1.0))
    row = job_row(JOB_ID, info())
    assert (row.launches, row.phase) == (2, "resizing")
    assert table_cells(row)[2] == "RUNNING (resizing)"
    assert table_cells(JobStatus(JOB_ID, state="RUNNING", phase="running"))[2] == "RUNNING"


@pytest.mark.parametrize("row,cell", [
    (JobStatus(JOB_ID), "-"),
    (JobStatus(JOB_ID, last_reason="user asked"), "user asked"),
    (JobStatus(JOB_ID, last_reason="x", decisions=[
        {"kind": "grow", "from_nodes": 1, "to_nodes": 2, "from_batch_size": 64,
         "to_batch_size": 128, "status": "observed"}]), "grow 1->2n b64->128 observed"),
])
def test_last_decision_cell(row, cell):
    assert table_cells(row)[-1] == cell


def test_cells_of_an_idle_row():
    assert table_cells(JobStatus(JOB_ID, name="t.py", state="PENDING")) == (
        JOB_ID, "t.py", "PENDING", "-", "-", "-", "0", "0", "0", "-", "0", "-")


# -- the command ---------------------------------------------------------------------------------


@pytest.fixture
def no_store(monkeypatch):
    monkeypatch.setattr(status, "open_store", lambda: None)


def test_status_json_and_table(jd, monkeypatch, no_store):
    monkeypatch.setattr(slurm, "squeue", lambda: {JOB_ID: info()})
    control(jd, 1, 128)
    r = CliRunner().invoke(status.status_command, ["--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc) == {"time", "control_dir", "slurm_error", "rounds", "jobs"}
    assert (doc["slurm_error"], doc["rounds"]) == (None, [])
    (row,) = doc["jobs"]
    assert set(row) == {f for f in JobStatus.__dataclass_fields__}
    assert (row["job_id"], row["state"], row["gpus"], row["target_global_batch_size"]) == (JOB_ID, "RUNNING", 4, 128)

    r = CliRunner().invoke(status.status_command, [])
    assert r.exit_code == 0, r.output
    header, line = r.output.splitlines()[:2]
    assert header.split() == ["JOBID", "NAME", "STATE", "NODELIST", "GPUS", "BATCH", "GEN", "EPOCH",
                              "SAMPLES", "SAMPLES/S", "RESTARTS", "LAST", "DECISION"]
    assert line.split() == [JOB_ID, "train.py", "RUNNING", "n[1-2]", "4", "64->128", "0/1", "0",
                            "0", "-", "0", "idle", "GPUs"]


def test_status_when_slurm_does_not_answer(jd, monkeypatch, no_store):
    def down():
        raise slurm.SlurmError("squeue: error: slurm_load_jobs error: Unable to contact slurm controller")

    monkeypatch.setattr(slurm, "squeue", down)
    r = CliRunner().invoke(status.status_command, [])
    assert r.exit_code == 1
    assert r.output.startswith("Slurm did not answer: squeue: error:")
    assert "UNKNOWN" in r.output.splitlines()[-1]
    doc = json.loads(CliRunner().invoke(status.status_command, ["--json"]).output)
    assert doc["slurm_error"].startswith("squeue: error:") and doc["jobs"][0]["state"] == "UNKNOWN"


def test_status_without_jobs(control_dir, monkeypatch, no_store):
    monkeypatch.setattr(slurm, "squeue", lambda: {})
    r = CliRunner().invoke(status.status_command, [])
    assert (r.exit_code, r.output.strip()) == (
        0, f"no active hpcsched jobs under {control_dir} (--all: finished ones too)")


# -- extension allocations ------------------------------------------------------------------------

from hpcsched.protocol.extensions import (  # noqa: E402
    EXTENSIONS_SCHEMA,
    Extension,
    Extensions,
    ExtensionState,
    write_extensions,
)


def extensions(d, *items):
    """``extensions.json`` with (job id, node, GPUs, state) entries."""
    write_extensions(d.extensions_path, Extensions(d.uid, JOB_ID, tuple(
        Extension(job_id, node, gpus, 1, ExtensionState(state), 1.0, 2.0)
        for job_id, node, gpus, state in items), 3.0))


def raw_extensions(d, entries, **top):
    doc = {"schema": EXTENSIONS_SCHEMA, "job_uid": d.uid, "primary_job_id": JOB_ID,
           "extensions": entries, "time": 1.0, **top}
    d.extensions_path.write_text(json.dumps(doc))


ENTRY = dict(job_id="101", node="n3", gpus=2, generation=1, state="joined", submitted_at=1.0,
             updated_at=2.0)
PRIMARY = {"role": "primary", "job_id": JOB_ID, "layout": {"n1": 2, "n2": 2}, "gpus": 4,
           "state": "RUNNING", "extension_state": ""}


def ext_alloc(job_id="101", node="n3", gpus=2, state="RUNNING", ext_state="joined"):
    return {"role": "extension", "job_id": job_id, "layout": {node: gpus}, "gpus": gpus,
            "state": state, "extension_state": ext_state}


# (files written, Slurm's queue (None: Slurm does not know the primary), total_gpus, layout,
#  allocations, GPUS cell)
EXT_ROWS = {
    "no extensions: the primary alone": (
        [], {JOB_ID: info()}, 4, {"n1": 2, "n2": 2}, [PRIMARY], "4"),
    "a joined extension adds its GPUs": (
        [lambda d: extensions(d, ("101", "n3", 2, "joined"))],
        {JOB_ID: info(), "101": info(job_id="101", nodes=1, node_count=1)},
        6, {"n1": 2, "n2": 2, "n3": 2}, [PRIMARY, ext_alloc()], "6 (4+2)"),
    "an extension on a node of the primary": (
        [lambda d: extensions(d, ("101", "n2", 1, "joined"))],
        {JOB_ID: info(), "101": info(job_id="101", nodes=1, node_count=1)},
        5, {"n1": 2, "n2": 3}, [PRIMARY, ext_alloc(node="n2", gpus=1)], "5 (4+1)"),
    "a submitted extension is shown, not counted": (
        [lambda d: extensions(d, ("101", "n3", 2, "submitted"))],
        {JOB_ID: info(), "101": info(job_id="101", state="PENDING", nodes=1, node_count=1)},
        4, {"n1": 2, "n2": 2}, [PRIMARY, ext_alloc(state="PENDING", ext_state="submitted")], "4"),
    "released, lost and refused extensions are not shown": (
        [lambda d: extensions(d, ("101", "n3", 2, "released"), ("102", "n3", 2, "lost"),
                              ("103", "n4", 1, "refused"), ("104", "n4", 2, "joined"))],
        {JOB_ID: info(), "104": info(job_id="104", nodes=1, node_count=1)},
        6, {"n1": 2, "n2": 2, "n4": 2}, [PRIMARY, ext_alloc("104", "n4")], "6 (4+2)"),
    "the acknowledged layout wins over extensions.json": (
        [lambda d: extensions(d, ("101", "n3", 2, "joined"), ("102", "n4", 2, "submitted")),
         lambda d: ack(d, 2, layout={"n1": 2, "n2": 2, "n3": 2, "n4": 2})],
        {JOB_ID: info(), "101": info(job_id="101", nodes=1, node_count=1),
         "102": info(job_id="102", nodes=1, node_count=1)},
        8, {"n1": 2, "n2": 2, "n3": 2, "n4": 2},
        [PRIMARY, ext_alloc(), ext_alloc("102", "n4", ext_state="submitted")], "8 (4+4)"),
    "an extension Slurm has forgotten": (
        [lambda d: extensions(d, ("101", "n3", 2, "joined"))], {JOB_ID: info()},
        6, {"n1": 2, "n2": 2, "n3": 2}, [PRIMARY, ext_alloc(state="GONE")], "6 (4+2)"),
    "a job id of another user's is not described": (
        [lambda d: extensions(d, ("101", "n3", 2, "joined"))],
        {JOB_ID: info(), "101": info(job_id="101", user="mallory", nodes=1, node_count=1)},
        6, {"n1": 2, "n2": 2, "n3": 2}, [PRIMARY, ext_alloc(state="OTHER USER")], "6 (4+2)"),
    "the primary is gone: its extensions count for nothing": (
        [lambda d: extensions(d, ("101", "n3", 2, "joined"))], None,
        0, {}, [ext_alloc(state="GONE")], "-"),
}


@pytest.mark.parametrize("writes,queue,total,layout,allocations,cell", EXT_ROWS.values(),
                         ids=EXT_ROWS.keys())
def test_extension_allocations(jd, writes, queue, total, layout, allocations, cell):
    for write in writes:
        write(jd)
    row = job_row(JOB_ID, (queue or {}).get(JOB_ID), queue=queue or {})
    assert (row.total_gpus, row.layout, row.allocations) == (total, layout, allocations)
    assert table_cells(row)[4] == cell
    assert row.problems == []


BROKEN_EXTENSIONS = {
    "not JSON": lambda d: d.extensions_path.write_text("{"),
    "a list": lambda d: d.extensions_path.write_text("[]"),
    "another job's": lambda d: raw_extensions(d, [ENTRY], job_uid="someone-else"),
    "extensions not a list": lambda d: raw_extensions(d, {"a": ENTRY}),
    "an entry with an unknown field": lambda d: raw_extensions(d, [{**ENTRY, "x": 1}]),
    "an entry without a field": lambda d: raw_extensions(d, [{k: v for k, v in ENTRY.items() if k != "gpus"}]),
    "a node that is not a string": lambda d: raw_extensions(d, [{**ENTRY, "node": ["n3"]}]),
    "a state that is not a string": lambda d: raw_extensions(d, [{**ENTRY, "state": ["joined"]}]),
    "an unknown state": lambda d: raw_extensions(d, [{**ENTRY, "state": "borrowed"}]),
    "negative GPUs": lambda d: raw_extensions(d, [{**ENTRY, "gpus": -2}]),
    "a boolean generation": lambda d: raw_extensions(d, [{**ENTRY, "generation": True}]),
    "too many entries": lambda d: raw_extensions(d, [ENTRY] * 1025),
    "too large": lambda d: d.extensions_path.write_text(" " * (2 << 20) + "{}"),
    "a symbolic link": lambda d: d.extensions_path.symlink_to(d.spec_path),
    "a directory": lambda d: d.extensions_path.mkdir(),
}


@pytest.mark.parametrize("write", BROKEN_EXTENSIONS.values(), ids=BROKEN_EXTENSIONS.keys())
def test_a_broken_extensions_file_is_a_problem_not_a_traceback(jd, write):
    write(jd)
    row = job_row(JOB_ID, info(), queue={JOB_ID: info()})
    assert len(row.problems) == 1 and "extensions.json" in row.problems[0]
    assert (row.total_gpus, row.allocations) == (4, [PRIMARY])
    assert table_cells(row)[4] == "4"


def test_allocations_table(jd, monkeypatch, no_store):
    extensions(jd, ("101", "n3", 2, "joined"), ("102", "n4", 1, "submitted"))
    monkeypatch.setattr(slurm, "squeue", lambda: {
        JOB_ID: info(), "101": info(job_id="101", nodes=1, node_count=1),
        "102": info(job_id="102", state="PENDING", nodes=1, node_count=1)})
    r = CliRunner().invoke(status.status_command, [])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].split()[3:6] == ["n[1-2]", "6", "(4+2)"]
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("allocations"))
    assert [line.split() for line in lines[start + 1:start + 5]] == [
        ["JOBID", "ALLOCATION", "ROLE", "NODE", "GPUS", "GPUS", "STATE"],
        [JOB_ID, JOB_ID, "primary", "n1:2,n2:2", "4", "RUNNING"],
        [JOB_ID, "101", "extension", "n3:2", "2", "RUNNING", "(joined)"],
        [JOB_ID, "102", "extension", "n4:1", "1", "PENDING", "(submitted)"]]
    doc = json.loads(CliRunner().invoke(status.status_command, ["--json"]).output)
    (row,) = doc["jobs"]
    assert (row["gpus"], row["total_gpus"], row["layout"]) == (4, 6, {"n1": 2, "n2": 2, "n3": 2})
    assert [a["job_id"] for a in row["allocations"]] == [JOB_ID, "101", "102"]


def test_no_allocations_table_without_extensions(jd, monkeypatch, no_store):
    monkeypatch.setattr(slurm, "squeue", lambda: {JOB_ID: info()})
    r = CliRunner().invoke(status.status_command, [])
    assert r.exit_code == 0 and "allocations" not in r.output


def test_a_store_this_user_may_not_reach_is_no_store(tmp_path, monkeypatch):
    """A store directory of mode 0700 (the daemon's own) makes Path.exists raise for another
    user: status goes on without the store instead of a traceback."""
    from hpcsched.daemon import status as st

    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path / 'private' / 'h.db'}")

    def refused(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(st.Path, "exists", refused)
    assert st.open_store() is None


def test_finished_jobs_only_with_all(jd, monkeypatch, no_store):
    """By default the jobs Slurm lists as active; --all (or the job's id) shows a finished one."""
    for queue in ({JOB_ID: info(state="COMPLETED")}, {}):     # listed as ended, or forgotten
        monkeypatch.setattr(slurm, "squeue", lambda q=queue: q)
        assert json.loads(CliRunner().invoke(status.status_command, ["--json"]).output)["jobs"] == []
        doc = json.loads(CliRunner().invoke(status.status_command, ["--json", "--all"]).output)
        assert [j["job_id"] for j in doc["jobs"]] == [JOB_ID]
        doc = json.loads(CliRunner().invoke(status.status_command, ["--json", JOB_ID]).output)
        assert [j["job_id"] for j in doc["jobs"]] == [JOB_ID]


def test_the_command_line_starts_without_scipy():
    """``hpcsched`` (status, resize, ...) imports no scipy: only the policies' fits and Sia's
    integer program use it, inside the functions that need it. scipy.optimize alone took about
    half of ``hpcsched status``'s start-up."""
    import subprocess
    import sys
    code = ("import sys, hpcsched.cli, hpcsched.daemon.config, hpcsched.daemon.status;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
