"""Claims checked on the real dev cluster (issue 33, "a lying job"): beside an honest job, an
emulated job that reports 10% of the work it has left (``--claim-work 0.1``) is caught by the
daemon from its own progress files, and its report is no longer used; the honest job's never
raises a doubt."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import finished, start_daemon, stop_daemon, submit, wait_for

EMULATED = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "emulated.py"
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_job_that_understates_its_work_is_caught_by_the_daemon(daemon_env, devcluster,
                                                                  slurm_jobs):
    tmp_path, _ = daemon_env
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', ""))   # jct, the default
    args = ("-N", "1", "--gres=gpu:2", "--hpcsched-application", "ncf", "--hpcsched-batch-size",
            "256", str(EMULATED), "--application", "ncf", "--scale", "0.02")
    honest = submit(tmp_path, *args)
    liar = submit(tmp_path, *args, "--claim-work", "0.1")
    slurm_jobs.extend([honest, liar])
    log = tmp_path / "daemon.log"
    proc = start_daemon(tmp_path)
    try:
        wait_for(lambda: "no longer used" in log.read_text(), 180,
                 "the daemon to stop using the liar's report")
        assert not finished([honest])   # the honest job was watched as long as the liar
    finally:
        stop_daemon(proc)
    text = log.read_text()
    doubts = re.findall(r"job (\d+): has done \d+ samples, more than the \d+ it claimed", text)
    print("\n".join(line for line in text.splitlines() if "claimed in all" in line))
    assert set(doubts) == {liar} and len(doubts) >= 2, text[-3000:]
    assert re.search(rf"job {liar}: .*broken claims of work: 2; its reported work is no longer "
                     "used", text)
