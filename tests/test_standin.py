"""The light job stand-in for scale runs (hpcsched/job/standin.py): its step times are the
simulator's physics, and on the real dev cluster it speaks the protocol a real job speaks --
acknowledgements, progress, a metrics line per step for every rank, a reform grow through a real
extension job and its release -- and ends once its work is done."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcsched import slurm
from hpcsched.job import standin
from hpcsched.job.extension import ACK_MARGIN_S, EXTENSION_BLOCKED, EXTENSION_TIMEOUT
from hpcsched.job.standin import PRIMARY_STALE_S, Extension, StepPhysics
from hpcsched.job.submit import submit as hpcsub
from hpcsched.model.snapshot import NodeView
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import Extension as ExtensionEntry
from hpcsched.protocol.extensions import ExtensionState
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import LauncherPhase
from hpcsched.sim.emulate import Emulation
from hpcsched.slurm.parse import JobInfo
from tests.conftest import cli, wait_for

EMULATED = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "emulated.py"


@pytest.mark.parametrize("app", ["cifar10", "bert", "ncf"])
def test_step_times_are_the_physics_at_the_table_points_and_between_them(app):
    emu = Emulation.of(app)
    table = emu.step_table(8, 4, points=6)
    phys = StepPhysics(json.loads(json.dumps(table)))   # through JSON, as the job reads it
    for gpus, placement in ((1, (1,)), (4, (4,)), (6, (4, 2)), (8, (4, 4))):
        rows = table["steps"][str(gpus)]
        for m, _, _ in rows:
            for accum in (1, 3):
                want = emu.app.step_time(placement, m, accum)
                got, compute = phys.step_time(gpus, m, accum)
                assert got == pytest.approx(want, rel=1e-9)
                assert 0 < compute <= got
        (m0, s0, _), (m1, s1, _) = rows[1], rows[2]
        mid, _ = phys.step_time(gpus, (m0 + m1) / 2, 1)
        assert min(s0, s1) <= mid <= max(s0, s1)
    # outside the table: clamped; a GPU count it lacks: the nearest one's
    assert phys.step_time(4, 10 ** 9, 1) == phys.step_time(4, table["steps"]["4"][-1][0], 1)
    assert phys.step_time(9, 64, 1) == phys.step_time(8, 64, 1)


def test_an_extension_ends_when_its_primary_is_gone(tmp_path, monkeypatch):
    """The primary ended (its launcher says so), was killed without a word (no progress.json
    for PRIMARY_STALE_S), or its directory is gone: the extension stand-in does not wait for a
    release that will never come."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    jd = JobDir.create(tmp_path / "jobs")
    ext = Extension(jd)
    now = time.time()
    assert ext.primary_gone(now) == ""                      # no progress yet: just started
    jd.progress_path.write_text("{}")
    assert ext.primary_gone(now) == ""
    assert "no progress for" in ext.primary_gone(now + PRIMARY_STALE_S + 5)
    ctl.write_launcher_state(jd.launcher_path, ctl.LauncherState(
        job_uid=jd.uid, job_id="76", phase=LauncherPhase.FINISHED, launches=1, resizes=0,
        restarts=0, time=now))
    assert "finished" in ext.primary_gone(now)
    jd.launcher_path.unlink()
    monkeypatch.setattr(standin, "PRIMARY_POLL_S", 0.0)
    monkeypatch.setattr(standin, "_nap", lambda: None)
    jd.extensions_dir.mkdir(exist_ok=True)
    os.utime(jd.progress_path, (now - PRIMARY_STALE_S - 5,) * 2)
    assert ext.run() == 0                                   # returns: no progress for too long
    assert (jd.extensions_dir / "ready-77").exists()
    shutil.rmtree(jd.path)
    assert "is gone" in ext.primary_gone(now)


def test_a_slurm_that_does_not_answer_leaves_a_waiting_grow_waiting(tmp_path, monkeypatch):
    """The stand-in's grow polls Slurm for its extension jobs; an unanswered squeue (slurmctld
    busy at 1,024 GPUs) is asked again at the next poll, not the primary's end: such
    tracebacks failed 75 stand-in jobs in benchmarks/daemon_scale.py's 1,024-GPU run."""
    jd = JobDir.create(tmp_path / "jobs")
    calls = []

    def unanswered():
        calls.append(1)
        raise slurm.SlurmUnavailable("squeue --json reported errors: slurm_load_jobs")

    joined = standin.Joined(jd, None, "5000")
    monkeypatch.setattr(joined.extender, "slurm_states", unanswered)
    now = time.time()
    control = SimpleNamespace(ack_by=0.0)        # no deadline given: EXTENSION_TIMEOUT applies
    joined.pending = (control, "plan", now, now - standin.EXTENSION_POLL_S - 1)
    assert joined._stalled(["6606"], now) == ""
    assert len(calls) == 1
    assert joined.pending[3] == now                         # asked again at the next poll
    assert joined._stalled(["6606"], now + 1) == "" and len(calls) == 1   # not before it
    late = now + EXTENSION_TIMEOUT + 1
    assert "did not start within" in joined._stalled(["6606"], late)


def _joined_with_an_extension_pending(tmp_path, monkeypatch, reason: str, n4: NodeView):
    """A stand-in's rank 0 whose extension 6606 (2 GPUs on n4) Slurm lists pending for
    ``reason``, with ``n4`` as sinfo shows it."""
    joined = standin.Joined(JobDir.create(tmp_path / "jobs"), None, "5000")
    joined.extender.items = [ExtensionEntry("6606", "n4", 2, 1, ExtensionState.SUBMITTED, 0.0, 0.0)]
    pending = JobInfo(job_id="6606", name="x+ext", user="alice", state="PENDING",
                      state_reason=reason, partition="gpu", nodes="", node_count=1,
                      gpus_per_node=0, restarts=0, batch_host="", priority=1)
    monkeypatch.setattr(joined.extender, "slurm_states", lambda: {"6606": pending})
    monkeypatch.setattr(slurm, "nodes", lambda timeout=None: (n4,))
    return joined


def test_the_stand_in_gives_up_a_grow_another_job_got_ahead_of(tmp_path, monkeypatch):
    """The real job's rule (``Extender.stalled``): an extension pending on a node whose GPUs
    another job took is given up after ``EXTENSION_BLOCKED`` seconds, not the timeout."""
    joined = _joined_with_an_extension_pending(tmp_path, monkeypatch, "Resources",
                                               NodeView("n4", 4, 3, "mixed"))
    now = time.time()
    joined.pending = (SimpleNamespace(ack_by=0.0), "plan", now - EXTENSION_BLOCKED, 0.0)
    assert joined._stalled(["6606"], now) == (
        f"extension job 6606 cannot start: n4 has 1 free GPU(s), it needs 2 (other jobs hold "
        f"them; pending over {EXTENSION_BLOCKED:.0f} s)")


def test_the_stand_in_gives_up_a_grow_in_time_to_answer_by_the_controls_deadline(tmp_path, monkeypatch):
    """An extension Slurm keeps behind other jobs (reason ``Priority``: extension jobs come
    last) is given up ``ACK_MARGIN_S`` before the control's ``ack_by``, with Slurm's reason,
    where the daemon would time the generation out without one (1,024-GPU run: 203 extension
    jobs pending for Priority)."""
    joined = _joined_with_an_extension_pending(tmp_path, monkeypatch, "Priority",
                                               NodeView("n4", 4, 0, "idle"))
    now = time.time()
    control = SimpleNamespace(ack_by=now + ACK_MARGIN_S + 30)
    joined.pending = (control, "plan", now - 150, 0.0)
    assert joined._stalled(["6606"], now) == ""                        # 30 s to spare
    control.ack_by = now + ACK_MARGIN_S - 1
    joined.pending = (control, "plan", now - 150, now - 2)      # looked 2 s ago: it looks again
    assert joined._stalled(["6606"], now) == (                   # at once, its deadline come
        "extension job 6606 did not start within 150 s, by when hpcsched needs the job's answer "
        "(Slurm: PENDING, reason Priority)")
    looks = []
    monkeypatch.setattr(joined.extender, "stalled", lambda *a: looks.append(a) or "")
    joined.pending = (control, "plan", now - 150, now - 0.5)    # already past it at that look:
    assert joined._stalled(["6606"], now) == "" and looks == []  # the 15-s interval again


def test_the_table_is_refused_for_a_bad_geometry():
    with pytest.raises(ValueError, match="max_gpus"):
        Emulation.of("cifar10").step_table(0, 4)


def test_hpcsub_writes_the_stand_in_batch_script_only_when_asked(control_dir, monkeypatch):
    """``submit(launcher=..., files=...)``: the batch script's last line runs the stand-in and
    its table is in the job directory; hpcsub's own scripts still run the launcher."""
    monkeypatch.setenv("PATH", "/nonexistent")   # no sbatch: the job directory is removed after
    for launcher in ("hpcsched.launcher", "hpcsched.job.standin"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            hpcsub(["--hpcsched-print-script", str(EMULATED)], launcher=launcher)
        assert out.getvalue().rstrip().endswith(f'-m {launcher} --job-dir "$HPCSCHED_JOB_DIR"')


def _submit(tmp_path: Path, total: int) -> tuple[str, JobDir]:
    table = Emulation.of("cifar10").step_table(8, 4) | {"total_samples": total, "dataset_size": 50_000}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = hpcsub(["--parsable", "-N", "1", "--gres=gpu:2", "--hpcsched-max-gpus", "8",
                     "--hpcsched-application", "cifar10", f"--output={tmp_path}/slurm-%j.out",
                     str(EMULATED)], launcher="hpcsched.job.standin",
                    files={"standin.json": json.dumps(table)})
    assert rc == 0, out.getvalue()
    job = out.getvalue().strip()
    return job, JobDir.for_job(job)


def _ack(jd: JobDir, generation: int) -> ctl.Ack | None:
    a = ctl.read_ack(jd.ack_path, jd.uid)
    return a if a is not None and a.generation == generation and a.state == "applied" else None


@pytest.mark.slurm
def test_a_stand_in_job_grows_by_extension_is_released_and_finishes(devcluster, control_dir,
                                                                    slurm_jobs, tmp_path):
    job, jd = _submit(tmp_path, total=40_000)
    slurm_jobs.append(job)
    first = wait_for(lambda: _ack(jd, 0), 60, "the stand-in's acknowledgement of generation 0")
    assert first.world_size == 2 and first.nodes == 1
    node = slurm.job_info(job).nodes
    other = next(n for n in ("n1", "n2", "n3", "n4") if n != node)
    cli("hpcsched", "resize", job, "--layout", f"{node}:2,{other}:2", "--reason", "test")
    grown = wait_for(lambda: _ack(jd, 1), 60, "the reform onto an extension")
    assert grown.world_size == 4 and grown.layout == {node: 2, other: 2}
    ext = ctl.load_json_object(jd.extensions_path)["extensions"]
    assert [(e["node"], e["gpus"], e["state"]) for e in ext] == [(other, 2, "joined")]
    slurm_jobs.append(ext[0]["job_id"])
    time.sleep(3)   # some steps on 4 GPUs
    cli("hpcsched", "resize", job, "--layout", f"{node}:2", "--reason", "test")
    wait_for(lambda: _ack(jd, 2), 60, "the release of the extension")
    wait_for(lambda: (i := slurm.squeue().get(ext[0]["job_id"])) is None or not i.active, 60,
             "the released extension job's end")
    done = wait_for(lambda: (p := ctl.read_progress(jd.progress_path, jd.uid)) and p.finished and p,
                    120, "the stand-in's end")
    assert done.samples_processed >= 40_000 and done.total_samples == 40_000
    # progress.json says finished first; launcher.json follows once the extensions are released
    wait_for(lambda: (st := ctl.read_launcher_state(jd.launcher_path, jd.uid)) is not None
             and st.phase == "finished", 30, "the stand-in's launcher state 'finished'")
    files = sorted(p.name for p in jd.metrics_dir.iterdir())
    ext_id = ext[0]["job_id"]
    assert files == ["launch-1-ext-" + ext_id + "-rank-0.jsonl", "launch-1-ext-" + ext_id + "-rank-1.jsonl",
                     "launch-1-rank-0.jsonl", "launch-1-rank-1.jsonl"]
    rank0 = [json.loads(ln) for ln in (jd.metrics_dir / "launch-1-rank-0.jsonl").read_text().splitlines()]
    rank1 = [json.loads(ln) for ln in (jd.metrics_dir / "launch-1-rank-1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rank0] == list(range(1, len(rank0) + 1)) == [r["step"] for r in rank1]
    assert sum(r["global_samples"] for r in rank0) == done.samples_processed
    assert {r["world_size"] for r in rank0} == {2, 4}
    on4 = [r for r in rank0 if r["world_size"] == 4]
    ext0 = [json.loads(ln) for ln in (jd.metrics_dir / f"launch-1-ext-{ext_id}-rank-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ext0] == [r["step"] for r in on4] and ext0[0]["device"]["node"] == other
