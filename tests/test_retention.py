"""Nothing kept for ever (issue 33): finished jobs' directories and store rows expire after
``[retention] job_days`` / ``store_days``; active jobs, other users' links and directories that
are not a job's are left alone."""

from __future__ import annotations

from hpcsched.daemon.config import RetentionSettings, load
from hpcsched.daemon.retention import DAY_S, Retention, expired_dirs
from hpcsched.daemon.store import Store
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.limits import JobLimits

NOW = 1_000 * DAY_S
JOB = dict(workers_per_node=2, min_nodes=1, max_nodes=2, min_batch_size=64, max_batch_size=64,
           base_batch_size=64, user=current_user())


def _job(control, store, job_id: str, finished_days_ago: float | None) -> JobDir:
    jd = JobDir.create(control)
    jd.link_job_id(job_id)
    jd.write_spec(JobSpec(job_uid=jd.uid, script="/s/t.py", script_args=(), python="python3",
                          submit_dir="/s", sbatch_args=(), nodes=1,
                          limits=JobLimits(2, 1, 2, 64, 64, None, 64),
                          checkpoint_dir=str(jd.path / "checkpoints")))
    (jd.path / "checkpoints").mkdir()
    (jd.path / "checkpoints" / "step-000000010.pt").write_bytes(b"x")
    finished = None if finished_days_ago is None else NOW - finished_days_ago * DAY_S
    store.upsert_job(job_id=job_id, job_uid=jd.uid, last_seen=NOW - 40 * DAY_S,
                     finished_at=finished, **JOB)
    store.add_profile_samples([dict(job_id=job_id, time=NOW - 40 * DAY_S, world_size=2, nodes=1,
                                    local_batch_size=32, step_time=0.1, throughput=640.0)])
    return jd


def test_expired_is_finished_long_enough_and_not_active(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    control = tmp_path / "jobs"
    _job(control, store, "1", 31)
    _job(control, store, "2", 29)
    _job(control, store, "3", None)
    _job(control, store, "4", 31)
    got = expired_dirs(store.jobs(), active={"4"}, now=NOW, job_days=30)
    assert [j.job_id for j in got] == ["1"]
    assert expired_dirs(store.jobs(), active=(), now=NOW, job_days=0) == []


def test_a_sweep_removes_directories_then_store_rows(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    control = tmp_path / "jobs"
    old, recent, running = (_job(control, store, "1", 31), _job(control, store, "2", 29),
                            _job(control, store, "3", None))
    store.begin_round("jct", NOW - 100 * DAY_S, False)
    store.begin_round("jct", NOW - 1 * DAY_S, False)
    ret = Retention(RetentionSettings(job_days=30, store_days=90), store, control)
    assert ret.due()
    assert ret.sweep(active={"3"}, now=NOW) == {"dirs": 1, "jobs": 0, "rounds": 1, "offsets": 0}
    assert not old.path.exists() and not (control / current_user() / "by-id" / "1").exists()
    assert recent.path.is_dir() and running.path.is_dir()
    assert store.job("1") is not None, "its store rows stay until store_days"
    assert not ret.due(), "about once an hour"
    assert ret.sweep(active=(), now=NOW + 95 * DAY_S) == {"dirs": 1, "jobs": 2, "rounds": 1, "offsets": 0}
    assert store.job("1") is None and store.profile("1") == [] and store.job("3") is not None


def test_offsets_of_files_gone_go_and_the_rest_stay(tmp_path):
    """One ingest offset per rank's metrics file: once the file is gone (its job directory
    removed) and it was last read over a day ago, its row goes; a file still there keeps its
    offset, however old, and one read within the day keeps it even if gone."""
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    control = tmp_path / "jobs"
    done = _job(control, store, "1", 31)        # finished: its directory expires
    running = _job(control, store, "2", None)
    (done.metrics_dir / "launch-1-rank-0.jsonl").write_text("")
    (running.metrics_dir / "launch-1-rank-0.jsonl").write_text("")
    old = {str(done.metrics_dir / "launch-1-rank-0.jsonl"): 100,
           str(running.metrics_dir / "launch-1-rank-0.jsonl"): 200,
           str(tmp_path / "elsewhere" / "rank-0.jsonl"): 300}     # never there
    store.set_ingest_offsets(old, at=NOW - 2 * DAY_S)
    fresh = str(tmp_path / "gone-today.jsonl")
    store.set_ingest_offsets({fresh: 400}, at=NOW - 0.5 * DAY_S)
    ret = Retention(RetentionSettings(job_days=30, store_days=0), store, control)
    assert ret.sweep(active={"2"}, now=NOW) == {"dirs": 1, "jobs": 0, "rounds": 0, "offsets": 2}
    assert not done.path.exists()
    left = store.ingest_offsets([*old, fresh])
    assert left == {**dict.fromkeys(old, 0), str(running.metrics_dir / "launch-1-rank-0.jsonl"): 200,
                    fresh: 400}


def test_a_directory_that_is_not_the_jobs_is_left_alone(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    control = tmp_path / "jobs"
    jd = _job(control, store, "1", 31)
    (jd.path / "spec.json").unlink()              # not a job directory any more
    ret = Retention(RetentionSettings(job_days=30, store_days=0), store, control)
    assert ret.sweep(active=(), now=NOW) == {"dirs": 0, "jobs": 0, "rounds": 0, "offsets": 0}
    assert jd.path.is_dir()


def test_the_settings(tmp_path):
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text("[retention]\njob_days = 7\nstore_days = 0\n")
    assert load(cfg).retention == RetentionSettings(job_days=7.0, store_days=0.0)
