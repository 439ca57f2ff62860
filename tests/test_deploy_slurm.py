"""Deployability on the real dev cluster (issue 34): options hpcsub does not know go to sbatch
unchanged, which is the judge (its own error and exit status, or the option in the job);
``hpcsched check`` passes on the dev cluster and fails on a partition Slurm lacks, and the
daemon refuses to start with one."""

from __future__ import annotations

import os
import subprocess

import pytest

from hpcsched import slurm
from tests.conftest import EXAMPLE, cli

pytestmark = pytest.mark.slurm


def test_sbatch_judges_the_options_hpcsub_does_not_know(devcluster, control_dir, tmp_path,
                                                        slurm_jobs):
    refused = cli("hpcsub", "--container-image=nvcr.io/nvidia/pytorch:24.01", "-N", "1",
                  "--gres=gpu:1", str(EXAMPLE), check=False, cwd=tmp_path)
    direct = subprocess.run(["sbatch", "--container-image=x", "--wrap", "true"],
                            capture_output=True, text=True)
    assert refused.returncode == direct.returncode != 0, (refused, direct)
    assert "container-image" in refused.stderr and "Traceback" not in refused.stderr
    job = cli("hpcsub", "--parsable", "--hold", "--mail-type=END", "--comment=from-hpcsub", "-N", "1",
              "--gres=gpu:1", f"--output={tmp_path}/slurm-%j.out", str(EXAMPLE),
              cwd=tmp_path).stdout.strip()
    slurm_jobs.append(job)
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                           check=True).stdout
    assert "MailType=END" in shown and "Comment=from-hpcsub" in shown, shown
    assert slurm.job_info(job).state == "PENDING"


def test_check_passes_on_the_dev_cluster_and_the_daemon_refuses_a_missing_partition(
        devcluster, control_dir, tmp_path):
    control_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(control_dir, 0o1777)
    conf = tmp_path / "hpcsched.toml"
    conf.write_text(f'[daemon]\npartitions = ["gpu"]\ncontrol_dir = "{control_dir}"\n'
                    f'database_url = "sqlite:///{tmp_path / "h.db"}"\n'
                    f'lock_file = "{tmp_path / "d.lock"}"\n')
    ok = cli("hpcsched", "check", "--config", str(conf), check=False)
    assert ok.returncode == 0 and "FAIL" not in ok.stdout, ok.stdout
    assert "ok    partitions" in ok.stdout and "ok    slurm-version" in ok.stdout, ok.stdout
    conf.write_text(conf.read_text().replace('["gpu"]', '["gpu", "nosuch"]'))
    bad = cli("hpcsched", "check", "--config", str(conf), check=False)
    assert bad.returncode == 1 and "nosuch: not a Slurm partition" in bad.stdout, bad.stdout
    daemon = cli("hpcsched", "daemon", "--config", str(conf), check=False, timeout=60)
    assert daemon.returncode == 2 and "nosuch" in daemon.stderr, daemon
    assert "Traceback" not in daemon.stderr
