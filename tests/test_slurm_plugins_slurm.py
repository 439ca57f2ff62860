"""slurm-plugins/job_submit.lua on the real dev cluster (issue 13): ``hpcsched devcluster
plugins on`` puts it in slurmctld's path; it tags hpcsub jobs and their extension jobs in
AdminComment and leaves other jobs alone, refuses an elastic job over the partition's elastic
limits with a message, and holds new elastic jobs for the daemon's placement, which the daemon
lifts within a round, and Slurm anyway at the begin time when no daemon runs."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from hpcsched import slurm
from hpcsched.slurm.devcluster.base import LEND_QOS
from tests.conftest import EXAMPLE, cli, start_daemon, stop_daemon, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sbatch(tmp_path, slurm_jobs, *args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/plain-%j.out", *args],
                         capture_output=True, text=True, check=True)
    slurm_jobs.append(out.stdout.strip())
    return slurm_jobs[-1]


def test_hpcsub_jobs_are_tagged_and_others_are_not(plugins, control_dir, tmp_path, slurm_jobs):
    """Also the submission stamp: only another user's job rewrites it (the daemon's
    ``[daemon] submit_stamp`` looks at Slurm when it changes)."""
    stamp = tmp_path / "submitted"
    plugins(f"max_gpus = 16\nextension_qos = {LEND_QOS}\nsubmit_stamp = {stamp}\n")
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hold", "--hpcsched-max-nodes", "2",
                 str(EXAMPLE))
    slurm_jobs.append(job)
    assert not stamp.exists()                  # hpcsched's own job: nothing to look at
    plain = _sbatch(tmp_path, slurm_jobs, "--hold", "--wrap", "sleep 1")
    stamped = stamp.stat().st_mtime_ns
    ext = _sbatch(tmp_path, slurm_jobs, "--hold", "--comment", f"hpcsched-extension:{job}:abc:g1",
                  "--wrap", "sleep 1")
    assert stamp.stat().st_mtime_ns == stamped  # an extension job: not another user's either
    infos = slurm.squeue()
    uid = next(control_dir.glob("*/by-id")).joinpath(job).resolve().name
    assert infos[job].admin_comment == f"hpcsched:elastic job={uid} max_gpus=4"
    assert infos[plain].admin_comment == ""
    assert infos[ext].admin_comment == f"hpcsched:extension of {job}"
    assert infos[ext].qos == LEND_QOS and infos[plain].qos == infos[job].qos == "normal"


@pytest.mark.parametrize("settings, args, message", [
    ("max_gpus = 8\n", ("--hpcsched-max-nodes", "3"),
     "this elastic job may grow to 12 GPUs, but elastic jobs in partition gpu may hold at most 8"),
    ("partition.gpu.max_time = 60\n", ("--time=120",),
     "--time is 120 minutes, but elastic jobs in partition gpu may run at most 60 minutes"),
])
def test_an_elastic_job_over_the_partitions_limits_is_refused(plugins, control_dir, tmp_path,
                                                              settings, args, message):
    plugins(settings)
    before = set(slurm.squeue())
    r = cli("hpcsub", "-N", "1", "--gres=gpu:4", *args, str(EXAMPLE), cwd=tmp_path, check=False)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    # nothing submitted: no job that was not there before (under xdist another worker's job
    # may end meanwhile, so equality would race)
    assert set(slurm.squeue()) <= before
    assert not list(control_dir.glob("*/by-id/*"))  # and no job directory left


def test_a_job_within_the_limits_without_a_time_gets_the_partitions(plugins, control_dir,
                                                                    tmp_path, slurm_jobs):
    plugins("max_time = 45\n")
    script = tmp_path / "train.py"
    script.write_text(EXAMPLE.read_text().replace("#SBATCH --time", "#NOT-SBATCH --time"))
    job = submit(tmp_path, "-N", "1", "--gres=gpu:1", "--hold", str(script))
    slurm_jobs.append(job)
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "TimeLimit=00:45:00" in out, out


def test_held_for_placement_the_daemon_releases_the_job_within_a_round(
        plugins, daemon_env, tmp_path, slurm_jobs):
    plugins("hold_seconds = 600\n")
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
                 str(EXAMPLE), "--epochs", "2")
    slurm_jobs.append(job)
    info = wait_for(lambda: (i := slurm.job_info(job)) and i.state_reason.startswith("BeginTime")
                    and i, 30, "the job to pend for its begin time")
    assert info.admin_comment.endswith(" hold=600")
    proc = start_daemon(tmp_path)
    try:
        t0 = time.monotonic()
        wait_for(lambda: (i := slurm.job_info(job)) and i.state in ("RUNNING", "COMPLETED"), 60,
                 "the daemon to release the held job")
        released = time.monotonic() - t0
    finally:
        stop_daemon(proc)
    log = (tmp_path / "daemon.log").read_text()
    # a round every 2 s; Slurm schedules a released job within about 3 s (notes, section 5)
    assert released < 20, (released, log[-3000:])
    assert f"job {job}" in log


def test_held_for_placement_without_a_daemon_starts_at_its_begin_time(plugins, control_dir,
                                                                      tmp_path, slurm_jobs):
    plugins("hold_seconds = 10\n")
    job = submit(tmp_path, "-N", "1", "--gres=gpu:1", str(EXAMPLE), "--epochs", "1")
    slurm_jobs.append(job)
    assert slurm.job_info(job).admin_comment.endswith(" hold=10")
    # Slurm starts it once the begin time passed, at its next scheduling pass (up to a minute)
    wait_for(lambda: (i := slurm.job_info(job)) and i.state != "PENDING", 120,
             "Slurm to start the held job by itself")


def test_the_gpu_probe_prolog_runs_for_every_job_and_the_daemon_ingests_it(
        plugins, daemon_env, devcluster, tmp_path, slurm_jobs):
    """Every job's prolog writes the dcgm-exporter job mapping and probes the job's GPUs (a CPU
    stand-in here: the dev cluster's GPUs are fake) within its bound; the epilog removes the
    mapping; the daemon ingests the probes in its next round, and ``hpcsched status --gpus``
    shows them."""
    plugins("")
    state = devcluster.parent.parent
    spool, mapping = state / "gpu-probes", state / "job-mapping"
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(cfg.read_text() + f'[probe]\nspool_dir = "{spool}"\n')
    jobs = {_sbatch(tmp_path, slurm_jobs, "-w", "n1", "--gres=gpu:2", "--wrap",
                    "date +%s.%N; sleep 6"): "n1",
            submit(tmp_path, "-N", "1", "-w", "n2", "--gres=gpu:1", str(EXAMPLE),
                   "--epochs", "1"): "n2"}
    slurm_jobs.extend(j for j in jobs if j not in slurm_jobs)
    plain = next(iter(jobs))
    # while it runs, the job mapping names it for its GPUs (by index on the node); Slurm shows
    # the job RUNNING while its prolog still writes the files one GPU after the other
    started = wait_for(lambda: (i := slurm.job_info(plain)) and i.state == "RUNNING" and i, 60,
                       "the plain job")

    def mapped() -> list[str]:
        # one file per GPU index, replaced whole (mv); "<index>.tmp.<pid>" files come and go
        return sorted(p.name for p in mapping.glob("*")
                      if p.name.isdigit() and plain in p.read_text().split())

    wait_for(lambda: len(mapped()) >= 2, 30, "the job mapping of both GPUs")
    named = mapped()
    assert len(named) == 2, named
    assert not [p.name for p in mapping.glob("*")
                if p.name != ".lock" and not p.name.isdigit() and ".tmp." not in p.name]
    wait_for(lambda: all((i := slurm.job_info(j)) and not i.active for j in jobs), 180,
             "both jobs to end")
    wait_for(lambda: not any(plain in p.read_text().split() for p in mapping.glob("[0-9]*")),
             30, "the epilog to remove the job's mapping")
    # the prolog runs between the allocation and the batch script: within its 20 s bound
    script_began = float((tmp_path / f"plain-{plain}.out").read_text().split()[0])
    prolog = script_began - started.start_time
    print(f"prolog (mapping + probe of 2 GPUs): {prolog:.1f} s")
    assert 0 <= prolog < 20, prolog

    proc = start_daemon(tmp_path)
    try:
        wait_for(lambda: not list(spool.glob(f"*-{plain}.json")), 60,
                 "the daemon to ingest the probes")
    finally:
        stop_daemon(proc)
    doc = json.loads(cli("hpcsched", "status", "--gpus", "--json").stdout)
    probed = {(g["node"], g["job_id"]): g for g in doc["gpus"] if g["job_id"] in jobs}
    assert {(n, j) for n, j in probed} == {(n, j) for j, n in jobs.items()}, doc["gpus"]
    for g in probed.values():
        assert g["kind"] == "cpu-stand-in" and g["score"] > 0 and g["unit"] == "GFLOP/s", g
