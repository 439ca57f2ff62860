"""The site's limits, enforced by the daemon itself, on the real dev cluster (issue 33): a job
allowed 16 GPUs by its own spec, on an idle cluster where ``jct`` would grow it over every node
(``tests/test_neighbours_slurm.py``), never holds more than the site's 4 for its partition
(``[daemon] site_limits``: the job_submit plugin's settings file), even after its user rewrites
``spec.json`` to ask for more."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.protocol.extensions import parse_extension_comment
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import EXAMPLE, start_daemon, stop_daemon, submit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SITE_MAX = 4


def _gpus_held(job: str) -> int:
    """GPUs the job's primary and extension jobs hold now."""
    return sum(i.gpus_per_node * i.node_count for i in slurm.squeue().values()
               if i.state == "RUNNING" and (i.job_id == job or (
                   (tag := parse_extension_comment(i.comment)) and tag[0] == job)))


def test_a_job_is_never_grown_past_the_sites_limit(daemon_env, devcluster, slurm_jobs,
                                                   monkeypatch):
    monkeypatch.setenv("HPCSCHED_GRAD_NOISE", "0")
    tmp_path, _ = daemon_env
    site = tmp_path / "job_submit_hpcsched.conf"
    site.write_text(f"partition.gpu.max_gpus = {SITE_MAX}\n")
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', "")
                   .replace("[daemon]\n", f'[daemon]\nsite_limits = "{site}"\n'))
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-gpus", "16",
                 "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "60",
                 "--sample-time", "0.002")
    slurm_jobs.append(job)
    jd = JobDir.for_job(job)
    spec = json.loads(jd.spec_path.read_text())
    jd.spec_path.write_text(json.dumps({**spec, "max_nodes": 16}))   # the user asks for more
    proc = start_daemon(tmp_path)
    most = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            info = slurm.job_info(job)
            if info is None or not info.active:
                break
            most = max(most, _gpus_held(job))
            time.sleep(1.0)
    finally:
        stop_daemon(proc)
    log = (tmp_path / "daemon.log").read_text()
    assert most == SITE_MAX, (most, log[-3000:])    # grown, to the site's limit and no further
    print(f"the job held at most {most} GPUs (its spec: 16, then 32; the site: {SITE_MAX})")
