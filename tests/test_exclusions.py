"""Site controls (issue 34): the daemon never manages the hpcsub jobs of excluded users,
accounts or QOS (``[daemon] exclude_users``, ``exclude_accounts``, ``exclude_qos``); they are
other users' jobs to it."""

from __future__ import annotations

import json

from hpcsched import slurm
from hpcsched.daemon.config import load
from hpcsched.daemon.views import Exclusions, ManagedJobs
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import Observation
from hpcsched.slurm.parse import parse_squeue_json


def test_squeue_json_gives_the_account_and_qos():
    text = json.dumps({"jobs": [{"job_id": 7, "account": "physics", "qos": "low"}, {"job_id": 8}]})
    jobs = parse_squeue_json(text)
    assert (jobs["7"].account, jobs["7"].qos) == ("physics", "low")
    assert (jobs["8"].account, jobs["8"].qos) == ("", "")


def _info(job_id: str, **kw) -> slurm.JobInfo:
    return slurm.JobInfo(job_id=job_id, name="", user=kw.pop("user", current_user()),
                         state="RUNNING", state_reason="None", partition="gpu", nodes="n1",
                         node_count=1, gpus_per_node=2, restarts=0, batch_host="n1", priority=1,
                         **kw)


def job_dirs(root, job_ids) -> None:
    """A job directory under ``root`` with a spec (1 node x 2 GPUs) for each of ``job_ids``."""
    for job_id in job_ids:
        jd = JobDir.create(root)
        jd.link_job_id(job_id)
        jd.write_spec(JobSpec(job_uid=jd.uid, script="/s/t.py", script_args=(), python="python3",
                              submit_dir="/s", sbatch_args=(), nodes=1,
                              limits=JobLimits(2, 1, 2, 16, 256, None, 64),
                              checkpoint_dir=str(jd.path / "ck")))


def test_excluded_jobs_are_not_managed(tmp_path):
    job_dirs(tmp_path, ("1", "2", "3", "4"))
    jobs = {"1": _info("1", account="physics"), "2": _info("2", qos="debug"),
            "3": _info("3", account="bio", qos="normal"), "4": _info("4")}
    obs = Observation(time=0.0, nodes=(), jobs=jobs, calls=0)
    keep_out = Exclusions(accounts=frozenset({"physics"}), qos=frozenset({"debug"}))
    assert sorted(ManagedJobs(tmp_path, (), keep_out).find(obs)) == ["3", "4"]
    by_user = Exclusions(users=frozenset({current_user()}))
    assert ManagedJobs(tmp_path, (), by_user).find(obs) == {}
    assert sorted(ManagedJobs(tmp_path).find(obs)) == ["1", "2", "3", "4"]


def test_the_settings(tmp_path):
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text('[daemon]\nexclude_accounts = ["physics"]\nexclude_qos = ["debug", "long"]\n')
    d = load(cfg).daemon
    assert (d.exclude_users, d.exclude_accounts, d.exclude_qos) == ((), ("physics",), ("debug", "long"))
