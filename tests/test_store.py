"""The daemon's store: migrations, SQLite settings, the journal, aggregation, concurrency."""

import multiprocessing
import traceback

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.exc import IntegrityError

from hpcsched.daemon import store as st
from hpcsched.daemon.store import Store
from hpcsched.daemon.store.lists import padded

TABLES = {
    "jobs": {"job_id", "job_uid", "user", "script", "workers_per_node", "min_nodes", "max_nodes",
             "min_batch_size", "max_batch_size", "max_local_batch_size", "base_batch_size",
             "lr_scaling", "spec_json", "state", "submit_time", "first_seen", "last_seen",
             "finished_at", "app_class", "min_gpu_count"},
    "profile_samples": {"id", "job_id", "time", "launch", "generation", "world_size", "nodes",
                        "local_batch_size", "accumulation_steps", "global_batch_size",
                        "step_time", "throughput", "steps"},
    "gpu_measurements": {"id", "job_id", "time", "node", "local_rank", "gpu_index", "gpu_uuid",
                         "app_class", "relative_speed", "steps"},
    "rounds": {"id", "started_at", "duration", "policy", "objective", "jobs", "actions",
               "slurm_calls", "policy_seconds", "error", "dry_run"},
    "actions": {"id", "round_id", "job_id", "kind", "generation", "from_nodes", "to_nodes",
                "from_batch_size", "to_batch_size", "reason", "phase", "error", "created_at",
                "updated_at", "restarts_at_plan", "history", "placement", "mechanism"},
    "ingest_offsets": {"path", "offset", "updated_at"},
    "daemon_lease": {"name", "holder", "acquired_at", "renewed_at", "expires_at"},
    "gpu_probes": {"id", "time", "node", "gpu_index", "gpu_uuid", "model", "kind", "score", "unit",
                   "seconds", "job_id"},
}

JOB = dict(job_uid="uid-1", user="alice", script="train.py", workers_per_node=4, min_nodes=1,
           max_nodes=4, min_batch_size=32, max_batch_size=512, base_batch_size=128,
           lr_scaling="linear", spec_json='{"x": 1}', state="RUNNING")


HEAD = "0007"


def _url(path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db(tmp_path):
    s = Store(_url(tmp_path / "hpcsched.db"))
    s.upgrade()
    yield s
    s.close()


def _job(db, job_id="1", **kw):
    fields = {**JOB, "job_uid": f"uid-{job_id}", "last_seen": 100.0, **kw}
    db.upsert_job(job_id=job_id, **fields)


def _plan(db, job_id="1", **kw):
    fields = dict(job_id=job_id, kind="grow", generation=1, from_nodes=1, to_nodes=2,
                  from_batch_size=128, to_batch_size=256, reason="idle nodes", created_at=5.0)
    fields.update(kw)
    return db.plan_action(**fields)


# -- schema ------------------------------------------------------------------------------------


def test_upgrade_creates_every_table(tmp_path):
    s = Store(_url(tmp_path / "sub" / "dir" / "h.db"))  # the directory is created
    assert s.upgrade() == HEAD
    insp = inspect(s.engine)
    assert set(insp.get_table_names()) == set(TABLES) | {"alembic_version"}
    for table, columns in TABLES.items():
        assert {c["name"] for c in insp.get_columns(table)} == columns, table
    idx = {tuple(i["column_names"]) for i in insp.get_indexes("profile_samples")}
    assert ("job_id", "world_size", "local_batch_size") in idx
    assert ("job_id", "phase") in {tuple(i["column_names"]) for i in insp.get_indexes("actions")}
    assert {fk["referred_table"] for fk in insp.get_foreign_keys("actions")} == {"jobs", "rounds"}
    assert [u["column_names"] for u in insp.get_unique_constraints("jobs")] == [["job_uid"]]
    s.close()


def test_store_creates_no_tables(tmp_path):
    s = Store(_url(tmp_path / "h.db"))
    assert s.current_revision() is None
    assert inspect(s.engine).get_table_names() == []
    s.close()


def test_upgrade_twice_is_a_noop(db):
    _job(db)
    assert db.current_revision() == HEAD
    assert db.upgrade() == HEAD
    assert db.upgrade() == HEAD
    assert db.job("1") is not None
    with db.engine.connect() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 1


def test_migrations_match_the_orm(db):
    """The hand-kept migrations and the ORM models describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(ctx, st.Base.metadata) == []


def test_downgrade_and_upgrade_through_env_without_connection(tmp_path):
    """env.py also works on its own engine (as the alembic command line would use it)."""
    from alembic import command

    url = _url(tmp_path / "h.db")
    s = Store(url)
    s.upgrade()
    cfg = st.alembic_config(url)
    command.downgrade(cfg, "base")
    assert s.current_revision() is None
    assert set(inspect(s.engine).get_table_names()) == {"alembic_version"}
    command.upgrade(cfg, "head")
    assert s.current_revision() == HEAD
    s.close()


def _insert_0001_action(conn, id_, status, kind="grow", created=10.0, updated=20.0):
    conn.exec_driver_sql(
        "INSERT INTO actions (id, round_id, job_id, kind, generation, from_nodes, to_nodes, "
        "from_batch_size, to_batch_size, reason, status, error, created_at, updated_at, "
        f"restarts_at_plan) VALUES ({id_}, NULL, '1', '{kind}', {id_}, 1, 2, 32, 64, 'why', "
        f"'{status}', NULL, {created}, {updated}, 1)")


# 0001's status -> 0002's phase and history (from created_at / updated_at)
MIGRATED = [
    ("planned", "requested", (("requested", 10.0),)),
    ("applied", "requested", (("requested", 10.0),)),
    ("observed", "running", (("requested", 10.0), ("running", 20.0))),
    ("failed", "failed", (("requested", 10.0), ("failed", 20.0))),
]


def test_upgrade_from_0001_keeps_the_journal(tmp_path):
    """A database at 0001 with a journal in it: every row's status becomes a phase with its
    history; open ones stay open, and the resumed journal takes the new phases and kinds."""
    from alembic import command

    url = _url(tmp_path / "old.db")
    s = Store(url)
    command.upgrade(st.alembic_config(url), "0001")
    with s.engine.begin() as c:
        c.exec_driver_sql("INSERT INTO jobs (job_id, job_uid, user, script, workers_per_node, "
                          "min_nodes, max_nodes, min_batch_size, max_batch_size, "
                          "base_batch_size, lr_scaling, spec_json, state, first_seen, last_seen, "
                          "app_class) VALUES ('1', 'u1', 'a', 't.py', 2, 1, 2, 8, 256, 32, "
                          "'linear', '{}', 'RUNNING', 1.0, 1.0, '')")
        for i, (status, _, _) in enumerate(MIGRATED, start=1):
            _insert_0001_action(c, i, status)
    assert s.upgrade() == HEAD
    rows = {a.id: a for a in s.actions()}
    for i, (_, phase, history) in enumerate(MIGRATED, start=1):
        assert (rows[i].phase, rows[i].history, rows[i].placement) == (phase, history, ()), i
        assert (rows[i].kind, rows[i].to_batch_size, rows[i].restarts_at_plan) == ("grow", 64, 1)
    assert [a.id for a in s.open_actions()] == [1, 2]
    s.set_action_phase(1, "checkpointed", at=30.0)
    assert s.actions()[-1].history == (("requested", 10.0), ("checkpointed", 30.0))
    _plan(s, kind="preempt")
    s.close()


def test_downgrade_to_0001_maps_phases_back(tmp_path):
    from alembic import command

    url = _url(tmp_path / "h.db")
    s = Store(url)
    s.upgrade()
    _job(s)
    a, b, c, d = (_plan(s) for _ in range(4))
    s.set_action_phase(b, "checkpointed")
    s.set_action_phase(c, "running")
    s.set_action_phase(d, "failed", error="gone")
    _plan(s, kind="preempt")
    command.downgrade(st.alembic_config(url), "0001")
    with s.engine.connect() as conn:
        got = conn.exec_driver_sql("SELECT id, status, kind FROM actions ORDER BY id").all()
    assert got == [(a, "applied", "grow"), (b, "applied", "grow"), (c, "observed", "grow"),
                   (d, "failed", "grow")], "preempt rows go: 0001 cannot hold them"
    assert s.upgrade() == HEAD
    s.close()


def test_sqlite_pragmas_are_on_for_every_connection(db):
    conns = [db.engine.connect() for _ in range(3)]  # three pooled connections, all fresh
    try:
        for c in conns:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        for c in conns:
            c.close()


def test_wal_is_persistent_in_the_file(db, tmp_path):
    db.close()
    raw = create_engine(_url(tmp_path / "hpcsched.db"))  # a plain engine, no listeners
    with raw.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    raw.dispose()


def test_foreign_keys_are_enforced(db):
    with pytest.raises(IntegrityError):
        db.add_profile_samples([dict(job_id="ghost", time=1.0, world_size=1, nodes=1,
                                     local_batch_size=1, step_time=1.0, throughput=1.0)])
    with pytest.raises(IntegrityError):
        _plan(db, job_id="ghost")


def test_a_batch_is_one_transaction_and_a_failed_write_in_it_rolls_back_alone(db, tmp_path):
    other = Store(_url(tmp_path / "hpcsched.db"))   # another process's view of the file
    with db.batch():
        _job(db, "1")
        db.set_ingest_offset("/m/launch-1-rank-0.jsonl", 450)
        assert db.job("1") is not None and db.ingest_offset("/m/launch-1-rank-0.jsonl") == 450
        assert other.job("1") is None, "nothing is committed before the batch ends"
        with pytest.raises(IntegrityError):   # rolled back to its savepoint; the batch goes on
            db.add_profile_samples([dict(job_id="ghost", time=1.0, world_size=1, nodes=1,
                                         local_batch_size=1, step_time=1.0, throughput=1.0)])
        _job(db, "2")
    assert [j.job_id for j in other.jobs()] == ["1", "2"]
    assert other.ingest_offset("/m/launch-1-rank-0.jsonl") == 450
    with pytest.raises(RuntimeError), db.batch():   # an exception leaving it: nothing kept
        _job(db, "3")
        raise RuntimeError("the round failed")
    assert other.job("3") is None and db.job("3") is None
    db.touch_jobs(["1", "2", "ghost"], at=5000.0)   # last_seen only, in one statement
    assert [(j.job_id, j.last_seen, j.state) for j in other.jobs()] == [
        ("1", 5000.0, db.job("1").state), ("2", 5000.0, db.job("2").state)]
    other.close()


def test_script_location_is_the_repo_db_folder():
    loc = st.script_location()
    assert (loc / "env.py").is_file() and (loc / "versions").is_dir()
    assert loc.name == "db"


# -- jobs --------------------------------------------------------------------------------------


def test_upsert_job_inserts_then_updates(db):
    _job(db, last_seen=100.0, submit_time=90.0)
    j = db.job("1")
    assert isinstance(j, st.JobRow)
    assert j.user == "alice" and j.max_nodes == 4 and j.max_local_batch_size is None
    assert j.first_seen == 100.0 and j.last_seen == 100.0 and j.submit_time == 90.0
    assert j.app_class == "" and j.finished_at is None
    db.upsert_job(job_id="1", state="COMPLETED", last_seen=200.0, first_seen=150.0,
                  finished_at=199.0)
    j = db.job("1")
    assert j.state == "COMPLETED" and j.last_seen == 200.0 and j.finished_at == 199.0
    assert j.first_seen == 100.0, "first_seen is kept from the insert"
    assert j.user == "alice", "fields not given are left alone"
    assert db.job("nope") is None


def test_a_job_id_slurm_reuses_starts_fresh(db, caplog):
    """After a controller reset Slurm hands out job 1 again: the new job (another job
    directory) inherits nothing of the old one's profile or journal."""
    _job(db, last_seen=100.0)
    db.add_profile_samples([dict(job_id="1", time=1.0, world_size=2, nodes=1,
                                 local_batch_size=32, step_time=0.1, throughput=640.0)])
    _plan(db)
    _job(db, last_seen=150.0, state="RUNNING")          # the same job: its history stays
    assert db.profile("1") and db.actions("1")
    with caplog.at_level("WARNING"):
        _job(db, job_uid="uid-new", last_seen=300.0)
    j = db.job("1")
    assert (j.job_uid, j.first_seen) == ("uid-new", 300.0)
    assert db.profile("1") == [] and db.actions("1") == []
    assert "Slurm job id 1 now names another job" in caplog.text


def test_upsert_jobs_writes_new_and_known_jobs_in_one_write_and_all_or_none(db):
    """New jobs (one already finished: a field the others lack) and a known one, in one call
    inside a batch; a call with one bad row writes none of its rows and leaves the batch's
    other writes alone."""
    _job(db, "1", last_seen=100.0)
    rows = [{**JOB, "job_id": "2", "job_uid": "uid-2", "last_seen": 200.0},
            {**JOB, "job_id": "3", "job_uid": "uid-3", "last_seen": 200.0, "state": "COMPLETED",
             "finished_at": 199.0},
            {"job_id": "1", "state": "RUNNING", "last_seen": 200.0}]
    with db.batch():
        db.upsert_jobs(rows)
        bad = [{**JOB, "job_id": "4", "job_uid": "uid-4"}, {"job_id": "5", "job_uid": "uid-5"}]
        with pytest.raises(ValueError, match="missing field"):
            db.upsert_jobs(bad)
    assert (db.job("1").state, db.job("1").first_seen, db.job("1").last_seen) == ("RUNNING", 100.0, 200.0)
    assert (db.job("2").first_seen, db.job("2").finished_at) == (200.0, None)
    assert (db.job("3").state, db.job("3").finished_at) == ("COMPLETED", 199.0)
    assert db.job("4") is None and db.job("5") is None
    db.upsert_jobs([])


def test_upsert_job_validation(db):
    with pytest.raises(ValueError, match="missing field.*workers_per_node"):
        db.upsert_job(job_id="2", job_uid="u2", min_nodes=1, max_nodes=1, min_batch_size=1,
                      max_batch_size=1, base_batch_size=1)
    with pytest.raises(TypeError, match="unknown field.*colour"):
        db.upsert_job(job_id="2", colour="red")
    _job(db, "1")
    with pytest.raises(IntegrityError):  # job_uid is unique
        _job(db, "2", job_uid="uid-1")


def test_jobs_active_only(db):
    _job(db, "1", last_seen=1.0)
    _job(db, "2", last_seen=2.0, finished_at=3.0)
    _job(db, "3", last_seen=3.0)
    assert [j.job_id for j in db.jobs()] == ["1", "2", "3"]
    assert [j.job_id for j in db.jobs(active_only=True)] == ["1", "3"]


# -- samples -----------------------------------------------------------------------------------


def _sample(job_id="1", **kw):
    row = dict(job_id=job_id, time=100.0, world_size=4, nodes=1, local_batch_size=32,
               step_time=0.5, throughput=256.0, steps=10)
    row.update(kw)
    return row


def test_profile_aggregation_worked_example(db):
    _job(db, "1")
    _job(db, "2")
    n = db.add_profile_samples([
        _sample(step_time=0.5, throughput=256.0, steps=10, time=100.0),
        _sample(step_time=0.4, throughput=320.0, steps=30, time=200.0),
        _sample(world_size=8, nodes=2, step_time=0.6, throughput=426.0, steps=5, time=150.0),
        _sample(accumulation_steps=2, step_time=1.0, throughput=256.0, steps=4, time=50.0),
        _sample(job_id="2", step_time=9.0, throughput=1.0, steps=100),
    ])
    assert n == 5
    rows = db.profile("1")
    assert [(r.world_size, r.nodes, r.local_batch_size, r.accumulation_steps) for r in rows] == [
        (4, 1, 32, 1), (4, 1, 32, 2), (8, 2, 32, 1)]
    a, acc, b = rows
    # steps-weighted: (0.5*10 + 0.4*30) / 40 = 0.425 s; (256*10 + 320*30) / 40 = 304 samples/s
    assert a.step_time == pytest.approx(0.425)
    assert a.throughput == pytest.approx(304.0)
    assert (a.steps, a.samples, a.time, a.global_batch_size) == (40, 2, 200.0, 128)
    assert acc.global_batch_size == 256 and acc.steps == 4 and acc.step_time == 1.0
    assert b.global_batch_size == 256 and b.steps == 5 and b.throughput == pytest.approx(426.0)
    assert all(isinstance(r, st.ProfileRow) and r.job_id == "1" for r in rows)
    assert db.profile("nope") == []


def test_bulk_reads_answer_as_the_per_job_ones(db):
    """profiles / recent_actions (one query for many jobs) and the round's Prefetched view give
    what profile / actions give job by job."""
    from hpcsched.daemon.store.prefetch import Prefetched

    for j in ("1", "2", "3"):
        _job(db, j)
    db.add_profile_samples([_sample(step_time=0.5, throughput=256.0, steps=10),
                            _sample(world_size=8, nodes=2, step_time=0.6, throughput=426.0, steps=5),
                            _sample(job_id="2", step_time=9.0, throughput=1.0, steps=100)])
    for i in range(14):
        _plan(db, job_id="1" if i % 3 else "2", generation=i + 1, created_at=5.0 + i)
    assert db.profiles(["1", "2", "3"]) == {"1": db.profile("1"), "2": db.profile("2")}
    recent = db.recent_actions(["1", "2", "3"], limit=4)
    assert recent == {"1": db.actions("1", limit=4), "2": db.actions("2", limit=4)}
    assert db.profiles([]) == {} and db.recent_actions([]) == {}
    view = Prefetched(db, ["1", "2", "3"])
    _plan(db, job_id="1", generation=99)          # written after: the view does not see it
    assert view.profile("1") == db.profile("1") and view.profile("3") == []
    assert view.actions("2", limit=10) == db.actions("2", limit=10)
    assert view.actions("1", limit=10) != db.actions("1", limit=10)
    assert view.actions("1", limit=50) == db.actions("1", limit=50)   # more than it holds: the store's
    assert view.job("1") == db.job("1")                                  # everything else: the store's


def test_profile_sample_validation(db):
    _job(db)
    assert db.add_profile_samples([]) == 0
    with pytest.raises(ValueError, match="missing field.*throughput"):
        db.add_profile_samples([{k: v for k, v in _sample().items() if k != "throughput"}])
    with pytest.raises(TypeError, match="unknown field"):
        db.add_profile_samples([_sample(bogus=1)])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        db.add_profile_samples([_sample(steps=0)])
    assert db.profile("1") == []


def test_gpu_speeds(db):
    _job(db, "1")
    _job(db, "2")
    n = db.add_gpu_measurements([
        dict(job_id="1", time=1.0, node="n1", local_rank=0, gpu_index="0", app_class="cnn",
             relative_speed=1.1, steps=10),
        dict(job_id="2", time=2.0, node="n1", local_rank=3, gpu_index="0", app_class="lm",
             relative_speed=0.9, steps=30),
        dict(job_id="1", time=3.0, node="n1", local_rank=1, app_class="cnn",
             relative_speed=1.0, steps=5),                  # no gpu_index: keyed by local rank
        dict(job_id="1", time=4.0, node="n2", local_rank=0, gpu_index=2, gpu_uuid="GPU-abc",
             relative_speed=0.8),                           # int index stored as "2"
    ])
    assert n == 4
    speeds = db.gpu_speeds()
    assert set(speeds) == {("n1", "0"), ("n1", "1"), ("n2", "2")}
    # (1.1*10 + 0.9*30) / 40 = 0.95
    assert speeds[("n1", "0")] == pytest.approx(0.95)
    assert speeds[("n1", "1")] == pytest.approx(1.0)
    assert speeds[("n2", "2")] == pytest.approx(0.8)
    assert db.gpu_speeds("cnn") == pytest.approx({("n1", "0"): 1.1, ("n1", "1"): 1.0})
    assert db.gpu_speeds("lm") == pytest.approx({("n1", "0"): 0.9})
    assert db.gpu_speeds("none") == {}
    assert db.gpu_speeds(since=2.5) == pytest.approx({("n1", "1"): 1.0, ("n2", "2"): 0.8})


# -- rounds ------------------------------------------------------------------------------------


def test_rounds(db):
    r1 = db.begin_round("dp", started_at=10.0, dry_run=False)
    r2 = db.begin_round("dp", started_at=70.0, dry_run=True)
    assert r2 > r1
    db.end_round(r1, duration=1.5, objective=42.0, jobs=3, actions=1, slurm_calls=4,
                 policy_seconds=0.2)
    db.end_round(r2, duration=0.5, error="squeue timed out")
    rows = db.rounds()
    assert [r.id for r in rows] == [r2, r1]
    assert rows[0].dry_run is True and rows[0].error == "squeue timed out"
    assert rows[0].objective is None and rows[0].jobs == 0
    assert rows[1] == st.RoundRow(r1, 10.0, 1.5, "dp", 42.0, 3, 1, 4, 0.2, None, False)
    assert len(db.rounds(limit=1)) == 1
    with pytest.raises(TypeError):
        db.end_round(r1, started_at=0.0)
    with pytest.raises(KeyError):
        db.end_round(9999, duration=1.0)


# -- journal -----------------------------------------------------------------------------------


def test_journal_legal_transitions(db):
    _job(db)
    rid = db.begin_round("dp", 1.0, False)
    a = _plan(db, round_id=rid, restarts_at_plan=2, placement=("n1", "n2"))
    b = _plan(db, kind="shrink", generation=2, from_nodes=2, to_nodes=1)
    c = _plan(db, kind="batch", generation=3, from_nodes=1, to_nodes=1)
    row = db.actions()[-1]
    assert row.id == a and row.phase == "requested" and row.round_id == rid
    assert row.status == row.phase, "status is the phase's old name"
    assert row.restarts_at_plan == 2 and row.created_at == row.updated_at == 5.0
    assert row.placement == ("n1", "n2") and row.history == (("requested", 5.0),)
    assert [x.id for x in db.open_actions()] == [a, b, c]

    for t, phase in enumerate(("checkpointed", "requeued", "released", "rescheduled", "running")):
        db.set_action_phase(a, phase, at=6.0 + t)
    db.set_action_phase(b, "failed", error="scontrol: invalid node count", at=8.0)
    db.set_action_phase(c, "running")

    by_id = {x.id: x for x in db.actions("1")}
    assert by_id[a].phase == "running" and by_id[a].updated_at == 10.0
    assert by_id[a].history == (("requested", 5.0), ("checkpointed", 6.0), ("requeued", 7.0),
                                ("released", 8.0), ("rescheduled", 9.0), ("running", 10.0))
    assert by_id[b].phase == "failed" and by_id[b].error == "scontrol: invalid node count"
    assert by_id[b].history == (("requested", 5.0), ("failed", 8.0))
    assert by_id[c].phase == "running" and by_id[c].error is None
    assert by_id[c].placement == ()
    assert db.open_actions() == []


@pytest.mark.parametrize("path, bad", [
    ((), "requeued"),                        # requested -> requeued skips the checkpoint
    ((), "requested"),                       # no staying put in the journal
    (("checkpointed",), "checkpointed"),
    (("checkpointed",), "requested"),        # never backwards
    (("checkpointed", "requeued"), "rescheduled"),   # released first
    (("running",), "failed"),                # final phases are final
    (("running",), "checkpointed"),
    (("failed",), "running"),
    (("failed",), "failed"),
    ((), "done"),                            # not a phase at all
    ((), "observed"),                        # nor are the old statuses
    ((), "applied"),
])
def test_journal_illegal_transitions(db, path, bad):
    _job(db)
    a = _plan(db)
    for phase in path:
        db.set_action_phase(a, phase)
    before = db.actions()[0]
    with pytest.raises(ValueError):
        db.set_action_phase(a, bad)
    assert db.actions()[0] == before, "a refused transition changes nothing"


def test_journal_misc(db):
    _job(db, "1")
    _job(db, "2")
    with pytest.raises(KeyError):
        db.set_action_phase(12345, "running")
    with pytest.raises(ValueError, match="kind"):
        _plan(db, kind="explode")
    with pytest.raises(ValueError, match="missing field"):
        db.plan_action(job_id="1", kind="grow")
    with pytest.raises(TypeError):
        _plan(db, phase="running")            # a new action is always requested
    with pytest.raises(TypeError):
        _plan(db, history="[]")
    ids = [_plan(db, "1"), _plan(db, "2"), _plan(db, "1")]
    assert [a.id for a in db.actions()] == ids[::-1]
    assert [a.id for a in db.actions("1")] == [ids[2], ids[0]]
    assert [a.id for a in db.actions(limit=1)] == [ids[2]]
    assert [a.id for a in db.open_actions("2")] == [ids[1]]


def test_journal_takes_every_change_kind(db):
    """The store refuses no kind reconcile can emit (preempt included)."""
    from hpcsched.protocol.kinds import ChangeKind

    _job(db)
    for kind in ChangeKind:
        a = _plan(db, kind=kind)
        assert db.actions(limit=1)[0].kind == kind.value and db.actions(limit=1)[0].id == a


def test_planned_action_is_durable_before_plan_returns(db, tmp_path):
    _job(db)
    a = _plan(db)
    other = Store(_url(tmp_path / "hpcsched.db"))  # as a restarted daemon would see it
    try:
        assert [x.id for x in other.open_actions()] == [a]
    finally:
        other.close()


def _synchronous(db) -> int:
    """SQLite's ``synchronous`` level of the batch in progress (2 FULL, 1 NORMAL)."""
    from sqlalchemy import text

    return db._batch.execute(text("PRAGMA synchronous")).scalar_one()


def test_commits_are_synced_unless_the_caller_says_they_need_not_be(db):
    """The resize journal's commits sync the WAL (FULL); a batch with ``durable=False`` does not
    (NORMAL), and the level it sets does not outlive it on the pooled connection."""
    levels = []
    for durable in (True, False, True):
        with db.batch(durable=durable):
            levels.append(_synchronous(db))
            _job(db, job_id=f"j{len(levels)}")
    assert levels == [2, 1, 2]
    with db.batch():
        _plan(db, job_id="j1")
        assert _synchronous(db) == 2
    # what a non-durable commit wrote is there for the next reader (it is only not synced)
    other = Store(db.url)
    try:
        assert {j.job_id for j in other.jobs()} >= {"j1", "j2", "j3"}
    finally:
        other.close()


def test_commit_seconds_add_up_every_commit(db):
    before = db.commit_seconds
    _job(db)
    after_one = db.commit_seconds
    assert after_one > before
    with db.batch(durable=False):
        _job(db, job_id="2")
        _job(db, job_id="3")
        assert db.commit_seconds == after_one, "nothing is committed inside a batch"
    assert db.commit_seconds > after_one


def test_a_gpu_granular_change_keeps_its_mechanism_and_layout(db):
    from hpcsched.policies.realise import Mechanism

    _job(db)
    a = _plan(db, kind="reform", placement=("n1:4", "n2:2"), mechanism=Mechanism.EXTEND)
    b = _plan(db, kind="batch", generation=2)
    rows = {x.id: x for x in db.actions("1")}
    assert (rows[a].mechanism, rows[a].placement) == ("extend", ("n1:4", "n2:2"))
    assert rows[b].mechanism is None, "node granularity: none"


# -- ingest ------------------------------------------------------------------------------------


def test_ingest_offsets(db):
    p = "/ctl/uid/metrics/launch-0-rank-0.jsonl"
    assert db.ingest_offset(p) == 0
    db.set_ingest_offset(p, 1234)
    assert db.ingest_offset(p) == 1234
    db.set_ingest_offset(p, 5 * 2**32)  # past 32 bits
    assert db.ingest_offset(p) == 5 * 2**32
    assert db.ingest_offset(p + ".other") == 0
    with pytest.raises(ValueError):
        db.set_ingest_offset(p, -1)


# -- concurrency -------------------------------------------------------------------------------


def _writer(url, name, n, barrier, errors):
    try:
        s = Store(url)
        barrier.wait(timeout=60)
        for i in range(n):
            s.upsert_job(job_id="shared", job_uid="uid-shared", workers_per_node=1, min_nodes=1,
                         max_nodes=2, min_batch_size=1, max_batch_size=8, base_batch_size=4,
                         state=f"{name}-{i}")
            jid = f"{name}-{i}"
            s.upsert_job(job_id=jid, job_uid=f"uid-{jid}", workers_per_node=1, min_nodes=1,
                         max_nodes=2, min_batch_size=1, max_batch_size=8, base_batch_size=4)
            r = s.begin_round(name, float(i), False)
            a = s.plan_action(job_id=jid, round_id=r, kind="grow", generation=1, from_nodes=1,
                              to_nodes=2, from_batch_size=4, to_batch_size=8)
            s.set_action_phase(a, "checkpointed")
            s.add_profile_samples([dict(job_id="shared", time=float(i), world_size=1, nodes=1,
                                        local_batch_size=4, step_time=0.1, throughput=40.0)])
            s.set_ingest_offset(f"/metrics/{name}", i + 1)
            s.end_round(r, duration=0.01, actions=1)
            s.open_actions()
        s.close()
    except BaseException:
        errors.put(f"{name}: {traceback.format_exc()}")
        raise


def test_two_processes_write_concurrently(db, tmp_path):
    url = _url(tmp_path / "hpcsched.db")
    n = 40
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, name, n, barrier, errors))
             for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(db.jobs()) == 2 * n + 1
    assert len(db.actions(limit=10_000)) == 2 * n
    assert all(a.phase == "checkpointed" for a in db.actions(limit=10_000))
    assert len(db.rounds(limit=10_000)) == 2 * n
    assert db.profile("shared")[0].steps == 2 * n
    assert db.ingest_offset("/metrics/a") == n and db.ingest_offset("/metrics/b") == n


def _upgrader(url, barrier, errors):
    try:
        s = Store(url)
        barrier.wait(timeout=60)
        assert s.upgrade() == HEAD
        s.close()
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def test_two_processes_upgrade_one_fresh_file(tmp_path):
    url = _url(tmp_path / "fresh.db")
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_upgrader, args=(url, barrier, errors)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert [p.exitcode for p in procs] == [0, 0]
    s = Store(url)
    assert s.current_revision() == HEAD
    s.close()


# -- hpcsched db -------------------------------------------------------------------------------


def test_db_cli(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    monkeypatch.delenv("HPCSCHED_CONFIG", raising=False)
    runner = CliRunner()
    url = _url(tmp_path / "cli.db")
    res = runner.invoke(st.db_group, ["current", "--database-url", url])
    assert res.exit_code == 0 and res.output.strip() == "none"
    res = runner.invoke(st.db_group, ["upgrade", "--database-url", url])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == HEAD
    res = runner.invoke(st.db_group, ["current", "--database-url", url])
    assert res.output.strip() == HEAD

    # URL from a config file, and from the environment over the config file
    conf = tmp_path / "hpcsched.toml"
    conf.write_text(f'[daemon]\ndatabase_url = "{_url(tmp_path / "conf.db")}"\n')
    res = runner.invoke(st.db_group, ["upgrade", "--config", str(conf)])
    assert res.exit_code == 0 and res.output.strip() == HEAD
    assert (tmp_path / "conf.db").exists()
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", _url(tmp_path / "env.db"))
    res = runner.invoke(st.db_group, ["upgrade", "--config", str(conf)])
    assert res.exit_code == 0 and (tmp_path / "env.db").exists()

    conf.write_text("[daemon]\nbogus = 1\n")
    res = runner.invoke(st.db_group, ["current", "--config", str(conf)])
    assert res.exit_code == 1 and "unknown key 'bogus'" in res.output


def test_padded_lists_keep_their_values_and_take_a_power_of_two_length():
    assert padded([]) == [] and padded(["a"]) == ["a"]
    assert padded(["a", "b", "c"]) == ["a", "b", "c", "c"]
    assert [len(padded(range(n))) for n in (5, 8, 9, 1500)] == [8, 8, 16, 2048]
    # never past what SQLite binds: beyond 16,384 values a list is left as it is
    assert [len(padded(range(n))) for n in (16_384, 16_385, 30_000)] == [16_384, 16_385, 30_000]


def test_the_rounds_id_lists_take_few_sql_texts_whatever_their_length(db):
    """A round asks about all its jobs at once, and their number changes every round: each
    length as its own SQL text would be prepared and kept per connection (sqlite3 keeps 128);
    1 to 129 ids take one text per power of two, and the answers are the same."""
    for i in range(129):
        _job(db, str(i))
    texts: set[str] = set()
    event.listen(db.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: " IN (" in statement and texts.add(statement))
    for n in range(1, 130):
        ids = [str(i) for i in range(n)]
        db.touch_jobs(ids, at=float(n))
        db.recent_actions(ids)
        db.ingest_offsets([f"/m/{i}" for i in range(n)])
    assert len(texts) == 3 * 9, len(texts)     # 1, 2, 4, ..., 256 ids
    assert {db.job(str(i)).last_seen for i in (0, 64, 128)} == {129.0}
    db.touch_jobs(["0", "1", "2"], at=999.0)     # padded to 4 with "2": job 3 is not touched
    assert [db.job(str(i)).last_seen for i in range(4)] == [999.0, 999.0, 999.0, 129.0]
