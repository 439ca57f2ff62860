"""Deployability on the real dev cluster (issue 34): options hpcsub does not know go to sbatch
unchanged, which is the judge (its own error and exit status, or the option in the job);
``hpcsched check`` passes on the dev cluster and fails on a partition Slurm lacks, and the
daemon refuses to start with one; a job pinned with ``--hpcsched-no-resize`` and one of an
excluded account are never resized."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcsched import slurm
from tests.conftest import EXAMPLE, cli, daemon_store, start_daemon, stop_daemon, submit, wait_for

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


def _account(name: str) -> None:
    """Slurm account ``name`` with root in it (sacctmgr(1); idempotent): Slurm replaces an
    account it does not know by the user's default one."""
    subprocess.run(["sacctmgr", "-i", "add", "account", name], capture_output=True, timeout=30)
    subprocess.run(["sacctmgr", "-i", "add", "user", "root", f"account={name}"],
                   capture_output=True, timeout=30)


@pytest.mark.slow
def test_a_pinned_job_and_an_excluded_accounts_job_are_never_resized(daemon_env, devcluster,
                                                                     slurm_jobs):
    """On a free cluster ``jct`` grows what it may: not a job submitted with
    ``--hpcsched-no-resize``, nor one of an account in ``exclude_accounts``; a third job beside
    them shows the daemon was at work."""
    tmp_path, db = daemon_env
    _account("physics")
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', "")
                   .replace("[daemon]\n", '[daemon]\nexclude_accounts = ["physics"]\n'))
    common = ("-N", "1", "--gres=gpu:1", "--hpcsched-batch-size", "96")
    train = (str(EXAMPLE), "--epochs", "40", "--sample-time", "0.002")
    pinned = submit(tmp_path, *common, "--hpcsched-no-resize", *train)
    excluded = submit(tmp_path, "-A", "physics", *common, "--hpcsched-max-gpus", "8", *train)
    grown = submit(tmp_path, *common, "--hpcsched-max-gpus", "8", *train)
    slurm_jobs.extend([pinned, excluded, grown])
    assert slurm.job_info(excluded).account == "physics"
    proc = start_daemon(tmp_path)
    try:
        store = daemon_store(tmp_path, db)
        wait_for(lambda: any(a.job_id == grown for a in store.actions()), 120,
                 "the daemon to resize the third job")
        wait_for(lambda: "round 8:" in (tmp_path / "daemon.log").read_text(), 60,
                 "a few more rounds")
        acted = {a.job_id for a in store.actions()}
    finally:
        stop_daemon(proc)
    assert pinned not in acted and excluded not in acted, acted
    infos = slurm.squeue()
    for j in (pinned, excluded):
        assert infos[j].gpus_per_node * infos[j].node_count == 1, infos[j]
