"""A resize step carried over a round, on the real dev cluster: slurmctld stops answering (it is
``SIGSTOP``-ped, as a controller stuck in a long scheduling pass or on its state disk) while a
round's step of a pending job runs ``scontrol update``; the round stops waiting after its
``step_wait`` and goes on, the step stays under way in its thread, and once the controller
answers again the step ends, the job has the size the step asked for, and the next call
journals it (:class:`hpcsched.daemon.driving.Steps`; the logic alone in ``tests/test_driving.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from hpcsched import slurm
from hpcsched.daemon.actuator import Action, Actuator
from hpcsched.daemon.driving import IN_FLIGHT, Drive, Steps
from hpcsched.daemon.phases import History, Timeouts
from hpcsched.daemon.store import Store
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.control import CLISlurmControl
from tests.conftest import wait_for
from tests.test_daemon_faults import _slurmctld_pid

pytestmark = [pytest.mark.slurm]


def _num_nodes(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return re.search(r"NumNodes=(\S+)", out).group(1)


def test_a_step_waiting_for_a_stopped_slurmctld_is_carried_over(devcluster, slurm_jobs, tmp_path,
                                                                 control_dir):
    job = subprocess.run(["sbatch", "--parsable", "--hold", "-N1", "--gres=gpu:1",
                          f"--output={tmp_path}/held.out", "--wrap", "sleep 60"],
                         capture_output=True, text=True, check=True).stdout.strip()
    slurm_jobs.append(job)
    info = slurm.job_info(job)
    assert info is not None and info.state == "PENDING"
    jd = JobDir.create(control_dir)
    spec = JobSpec(job_uid=jd.uid, script="/s/train.py", script_args=(), python="python3",
                   submit_dir="/s", sbatch_args=(), nodes=1,
                   limits=JobLimits(1, 1, 2, 16, 512, None, 64, "linear"),
                   checkpoint_dir=str(jd.path / "checkpoints"), user=info.user)
    jd.write_spec(spec)
    jd.link_job_id(job)
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    store.upsert_job(job_id=job, job_uid=jd.uid, workers_per_node=1, min_nodes=1, max_nodes=2,
                     min_batch_size=16, max_batch_size=512, base_batch_size=64)
    aid = store.plan_action(job_id=job, kind="pending", generation=1, from_nodes=1, to_nodes=2,
                            from_batch_size=64, to_batch_size=64, reason="test",
                            created_at=time.time())
    drive = Drive(aid, Action(job, ChangeKind.PENDING, 1, 2, 64, 0, "test", "test", ()),
                  History.begin(time.time()), jd, spec, info)
    steps = Steps()
    pid = _slurmctld_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        outcome = steps.take(Actuator(CLISlurmControl(timeout=60), Timeouts()), store, [drive],
                             0.5)
        waited = time.monotonic() - t
        assert outcome == [IN_FLIGHT] and waited < 5, (outcome, waited)
        time.sleep(1.0)
        assert steps.in_flight() == {aid} and steps.land(store) == {}, \
            "the update waits for the stopped controller"
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while not (landed := steps.land(store)):
        assert time.monotonic() < deadline, "the step never ended"
        time.sleep(0.1)
    assert landed == {job: "requested"}, landed
    assert _num_nodes(job) == "2-2", "the update reached the controller once it answered"
    c = ctl.read_control(jd.control_path, jd.uid)
    assert c is not None and c.generation == 1 and c.nodes == 2
    assert [a.phase for a in store.actions()] == ["requested"]   # the job has not started
    steps.close(store, 0.0)
    wait_for(lambda: slurm.job_info(job) is not None, 10, "the job still known")
