"""The reaper on the dev cluster: a job tagged as an extension of a running primary is kept; once
the primary is cancelled it is reaped (squeue --json's comment, by-id lookup, scancel through
CLISlurmControl); a tagged job whose uid is not the primary's job directory's is left alone."""

from __future__ import annotations

import subprocess

import pytest

from hpcsched import slurm
from hpcsched.daemon.reaper import Reaper
from hpcsched.protocol.extensions import extension_comment
from hpcsched.protocol.jobdir import JobDir
from hpcsched.slurm.control import CLISlurmControl
from hpcsched.slurm.observe import SlurmCLIBackend
from tests.conftest import wait_for

pytestmark = pytest.mark.slurm


def sbatch(tmp_path, *args) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-N1", "--gres=gpu:1", "--ntasks=1",
                          f"--output={tmp_path}/slurm-%j.out", *args, "--wrap", "sleep 600"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().split(";")[0]


def active(job_id: str) -> bool:
    info = slurm.squeue().get(job_id)
    return info is not None and info.active


def test_orphans_are_reaped_on_slurm(devcluster, control_dir, slurm_jobs, tmp_path):
    jd = JobDir.create(control_dir)
    primary = sbatch(tmp_path)
    slurm_jobs.append(primary)
    jd.link_job_id(primary)
    extension = sbatch(tmp_path, f"--comment={extension_comment(primary, jd.uid, 1)}")
    foreign = sbatch(tmp_path, f"--comment={extension_comment(primary, 'u-not-this-job', 1)}")
    slurm_jobs.extend([extension, foreign])
    wait_for(lambda: slurm.squeue()[primary].state == "RUNNING", 60, "the primary to run")

    # as the daemon runs it: each round's scancel in a thread, its outcome taken in by settle()
    backend, control = SlurmCLIBackend(), CLISlurmControl()
    reaper = Reaper(control_dir, background=True)
    obs = backend.observe()
    assert obs.jobs[extension].comment == extension_comment(primary, jd.uid, 1)
    assert reaper.reap(obs, control) == [] and reaper.settle() == [] and reaper.reaped == 0

    slurm.cancel(primary)
    wait_for(lambda: not active(primary), 60, "the primary to end")
    assert reaper.reap(backend.observe(), control) == [] and reaper.settle() == [extension]
    assert reaper.reaped == 1
    wait_for(lambda: not active(extension), 60, "the orphan to end")
    assert active(foreign)
    assert reaper.reap(backend.observe(), control) == [] and reaper.settle() == []
    assert reaper.reaped == 1
