"""The worker side without Slurm or torch.distributed: the srun task's torch.distributed
environment (worker.torch_env), and the step-boundary message rank 0 broadcasts (its codec, and
what rank 0 puts in it from control.json)."""

from __future__ import annotations

import math
import time

import pytest

from hpcsched.job import worker
from hpcsched.job.boundary import ControlWatcher, Decision, Pace, agree
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import ControlAction

# ----------------------------------------------------------------------------- torch_env

_DEFAULTS = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
             "GROUP_RANK": "0"}


@pytest.mark.parametrize("env,want", [
    ({}, _DEFAULTS),
    # started by the launcher: the launch's sizes win over Slurm's (stale after a resize)
    ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "99",
      "SLURM_NTASKS_PER_NODE": "9", "HPCSCHED_WORLD_SIZE": "4",
      "HPCSCHED_WORKERS_PER_NODE": "2"},
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "GROUP_RANK": "1"}),
    # a plain srun: Slurm's task counts
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "8",
      "SLURM_NTASKS_PER_NODE": "4"},
     {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
      "GROUP_RANK": "1"}),
    # an empty launch variable counts as unset
    ({"SLURM_NTASKS": "8", "HPCSCHED_WORLD_SIZE": "", "HPCSCHED_WORKERS_PER_NODE": ""},
     {**_DEFAULTS, "WORLD_SIZE": "8"}),
])
def test_torch_env(env, want):
    assert worker.torch_env(env) == want


def test_worker_without_a_script_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        worker.main([])
    assert exc.value.code == 2 and "usage" in capsys.readouterr().err


# ----------------------------------------------------------------------- Decision codec

def _control(generation=2, action="continue", nodes=2, wpn=2, local=8, accum=3, lr=0.75):
    return ctl.Control(job_uid="u", generation=generation, action=action, nodes=nodes,
                       workers_per_node=wpn, global_batch_size=nodes * wpn * local * accum,
                       local_batch_size=local, accumulation_steps=accum, lr_scale=lr,
                       issued_at=0.0)


@pytest.mark.parametrize("decision", [
    Decision(),
    Decision(checkpoint_due=True),
    Decision.of(_control(), checkpoint_due=False),
    Decision.of(_control(action="checkpoint-and-shrink", nodes=1), checkpoint_due=True),
    Decision.of(_control(action="checkpoint-and-requeue", nodes=4, lr=1 / 3), False),
    Decision.of(_control(lr=math.sqrt(2) * 1e-12), False),   # below the old 1e-9 resolution
    Decision.of(_control(generation=2**40, lr=1e300), False),
    Decision(7, ControlAction.REFORM, 2, 0, 16, 1, 1.5, 6, False, form=3),
    Decision(checkpoint_due=True, next_in=256),
    Decision(stop=True),
])
def test_decision_round_trips_through_an_int64_broadcast(decision):
    import torch

    wire = torch.tensor(decision.encode(), dtype=torch.int64).tolist()
    assert len(wire) == 12
    assert Decision.decode(wire) == decision


def test_decision_of_a_control_carries_its_request():
    d = Decision.of(_control(action="checkpoint-and-shrink", nodes=1), checkpoint_due=True)
    assert (d.generation, d.action, d.nodes, d.workers_per_node, d.local_batch_size,
            d.accumulation_steps, d.lr_scale, d.world_size, d.checkpoint_due) == (
        2, ControlAction.CHECKPOINT_AND_SHRINK, 1, 2, 8, 3, 0.75, 2, True)
    assert Decision.decode(d.encode()).action is ControlAction.CHECKPOINT_AND_SHRINK


def test_pace_spaces_boundaries_by_the_measured_step_time(monkeypatch):
    """The first boundary and one with a new generation are followed by one at the next step;
    otherwise about ``interval`` seconds of steps, within [1, max_steps]."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    pace = Pace(interval=0.2, max_steps=50)
    assert pace.next_in(0) == 1                      # nothing measured yet
    clock[0] += 0.025                                # one 25 ms step
    assert pace.next_in(1) == 8                      # 0.2 s / 25 ms
    clock[0] += 8 * 0.5                              # steps became 0.5 s each
    assert pace.next_in(9) == 1
    clock[0] += 0.001
    assert pace.next_in(10) == 50                    # 1 ms steps: capped
    clock[0] += 0.05
    assert pace.next_in(60, new_generation=True) == 1
    clock[0] += 0.05
    assert pace.next_in(60) == 1                     # no step since: not measurable


def test_agree_carries_rank_0s_pace(tmp_path, monkeypatch):
    """With a pace, rank 0's decision says when the next boundary is; a decision with a new
    generation is followed by a boundary at the next step."""
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    jd = JobDir.create(tmp_path)
    watcher, pace = ControlWatcher(jd), Pace(interval=0.2)
    assert agree(watcher, None, None, 0, 0, False, pace=pace, step=0).next_in == 1
    clock[0] += 0.1
    assert agree(watcher, None, None, 0, 0, False, pace=pace, step=10).next_in == 20
    ctl.write_control(jd.control_path, ctl.Control(**{**_control().__dict__, "job_uid": jd.uid}))
    clock[0] += 0.2
    d = agree(watcher, None, None, 0, 0, False, pace=pace, step=30)
    assert (d.generation, d.next_in) == (2, 1)


def test_rank_0_decides_from_control_json_once_per_new_generation(tmp_path):
    """One rank (no group): a new generation once, nothing while the file is unchanged, and
    nothing for a generation not newer than the one in force."""
    jd = JobDir.create(tmp_path)
    watcher = ControlWatcher(jd)
    assert agree(watcher, None, None, rank=0, generation=0, checkpoint_due=False) == Decision()
    ctl.write_control(jd.control_path, ctl.Control(**{**_control().__dict__, "job_uid": jd.uid}))
    d = agree(watcher, None, None, rank=0, generation=0, checkpoint_due=True)
    assert (d.generation, d.local_batch_size, d.checkpoint_due) == (2, 8, True)
    assert agree(watcher, None, None, rank=0, generation=2, checkpoint_due=False) == Decision()
    time.sleep(0.01)
    ctl.write_control(jd.control_path, ctl.Control(**{**_control(generation=3).__dict__,
                                                     "job_uid": jd.uid}))
    assert agree(watcher, None, None, rank=0, generation=5, checkpoint_due=False) == Decision()
    assert agree(watcher, None, None, rank=1, generation=0, checkpoint_due=True) == Decision()


def test_a_control_file_for_another_job_is_ignored(tmp_path, caplog):
    jd = JobDir.create(tmp_path)
    ctl.write_control(jd.control_path, _control())          # job_uid "u", not this job
    assert ControlWatcher(jd).changed() is None
    assert "ignoring control file" in caplog.text and "not this job" in caplog.text


def test_an_unusable_control_file_is_logged_once_and_ignored(tmp_path, caplog):
    jd = JobDir.create(tmp_path)
    jd.control_path.symlink_to(jd.control_path)               # a loop: stat raises ELOOP
    watcher = ControlWatcher(jd)
    assert watcher.changed() is None and watcher.changed() is None   # the job goes on
    assert caplog.text.count("ignoring control file") == 1
    jd.control_path.unlink()
    ctl.write_control(jd.control_path, ctl.Control(**{**_control().__dict__, "job_uid": jd.uid}))
    assert watcher.changed().generation == 2
