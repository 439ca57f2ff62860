"""The store's WAL checkpointed off the round's thread (:mod:`hpcsched.daemon.store.checkpoint`),
on a real SQLite file: what a checkpoint copies is in the database file itself, the store's own
commits leave the WAL to it, and only one runs at a time."""

from __future__ import annotations

import shutil
import sqlite3
import threading

from hpcsched.daemon.store import Store
from hpcsched.daemon.store import checkpoint as cp
from hpcsched.daemon.store.checkpoint import AUTOCHECKPOINT_PAGES, BackgroundCheckpoint

JOB = dict(job_uid="uid", workers_per_node=1, min_nodes=1, max_nodes=2, min_batch_size=1,
           max_batch_size=8, base_batch_size=4, last_seen=1.0)


def _jobs_in_file_alone(db_file, tmp_path) -> int:
    """Jobs in the database file without its WAL (a copy of the file alone)."""
    copy = tmp_path / "alone.db"
    shutil.copyfile(db_file, copy)
    with sqlite3.connect(copy) as c:
        return c.execute("SELECT count(*) FROM jobs").fetchone()[0]


def _store(tmp_path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'hpcsched.db'}")
    s.upgrade()
    return s


def test_a_checkpoint_puts_the_wal_into_the_database_file(tmp_path):
    store = _store(tmp_path)
    try:
        ckpt = BackgroundCheckpoint(store)
        with store.batch(durable=False):
            for i in range(200):
                store.upsert_job(job_id=str(i), **{**JOB, "job_uid": f"uid-{i}"})
        # committed, the rows are in the WAL only until a checkpoint
        assert _jobs_in_file_alone(tmp_path / "hpcsched.db", tmp_path) == 0
        assert ckpt.start() and ckpt.wait(timeout=30)
        busy, wal_pages, done, seconds = ckpt.last
        assert busy == 0 and wal_pages > 0 and done == wal_pages and seconds >= 0
        assert _jobs_in_file_alone(tmp_path / "hpcsched.db", tmp_path) == 200
    finally:
        store.close()


def test_the_stores_connections_checkpoint_only_a_larger_wal(tmp_path):
    store = _store(tmp_path)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000
        listeners = len(store.engine.pool.dispatch.connect)
        BackgroundCheckpoint(store)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == \
                AUTOCHECKPOINT_PAGES
        BackgroundCheckpoint(store)   # a reloaded daemon's, on the same store: no second one
        assert len(store.engine.pool.dispatch.connect) == listeners + 1
    finally:
        store.close()


def test_one_checkpoint_at_a_time(tmp_path, monkeypatch):
    store = _store(tmp_path)
    release = threading.Event()
    try:
        ckpt = BackgroundCheckpoint(store)
        real_run = ckpt._run
        monkeypatch.setattr(ckpt, "_run", lambda: release.wait(30) and real_run())
        assert ckpt.start()
        assert not ckpt.start(), "one is running"
        release.set()
        assert ckpt.wait(timeout=30) and ckpt.last is not None
        assert ckpt.start() and ckpt.wait(timeout=30)
    finally:
        store.close()


def test_a_store_without_a_file_is_left_alone(tmp_path):
    store = Store("sqlite://")
    ckpt = BackgroundCheckpoint(store)
    assert not ckpt.enabled and not ckpt.start() and ckpt.wait() and ckpt.last is None
    store.close()


def test_a_failed_checkpoint_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    store = _store(tmp_path)
    try:
        ckpt = BackgroundCheckpoint(store)

        def refuse():
            raise sqlite3.OperationalError("disk I/O error")
        monkeypatch.setattr(ckpt._engine, "raw_connection", refuse)
        with caplog.at_level("WARNING", logger=cp.log.name):
            assert ckpt.start() and ckpt.wait(timeout=30)
        assert ckpt.last is None
        assert "background WAL checkpoint failed (disk I/O error)" in caplog.text
    finally:
        store.close()
