"""The store is the daemon's user's alone (issue 33): a SQLite file hpcsched creates is 0600, the
directory ``Store.upgrade`` creates for it 0700, SQLite's ``-wal``/``-shm`` files beside it 0600
too, whatever the umask; an existing file of ours that others may read is tightened (0644 ->
0600) with a warning, and no mode is ever loosened. No Slurm."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat

import pytest

from hpcsched.daemon.store import Store, schema
from hpcsched.daemon.store.schema import secure_sqlite_file, sqlite_file

SIDE = ("-wal", "-shm")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _beside(db, suffix):
    return db.with_name(db.name + suffix)


def _add_job(store: Store, job_id: str = "1") -> None:
    store.upsert_job(job_id=job_id, job_uid=f"u{job_id}", workers_per_node=1, min_nodes=1,
                     max_nodes=2, min_batch_size=8, max_batch_size=64, base_batch_size=8)


@pytest.fixture
def umask():
    """Sets the process's umask for one test (the daemon inherits whatever its parent had)."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o000], ids=["022", "002", "000"])
def test_a_new_store_its_wal_and_its_directory_are_the_owners_alone(tmp_path, umask, mask):
    umask(mask)
    db = tmp_path / "state" / "hpcsched.db"
    store = Store(f"sqlite:///{db}")
    try:
        store.upgrade()
        _add_job(store)
        assert store.job("1") is not None
        # while a connection is open, SQLite keeps its WAL and shared-memory files beside it
        for suffix in SIDE:
            assert _beside(db, suffix).exists(), suffix
        modes = {p.name: _mode(p) for p in [db, *(_beside(db, s) for s in SIDE)]}
        assert modes == {"hpcsched.db": 0o600, "hpcsched.db-wal": 0o600,
                         "hpcsched.db-shm": 0o600}
        assert _mode(db.parent) == 0o700
    finally:
        store.close()


def test_an_existing_directory_is_left_as_it_is(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)          # the admin's install -d -m 755 (gpu-probes live there too)
    with Store(f"sqlite:///{state / 'hpcsched.db'}") as store:
        store.upgrade()
    assert _mode(state) == 0o755 and _mode(state / "hpcsched.db") == 0o600


def test_a_world_readable_store_is_tightened_when_its_owner_opens_it(tmp_path, caplog):
    db = tmp_path / "hpcsched.db"
    with Store(f"sqlite:///{db}") as store:
        store.upgrade()
        _add_job(store)
    # an older hpcsched (or a umask of 022) left it 0644, and a reader holds its WAL open
    raw = sqlite3.connect(db)
    try:
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute("SELECT count(*) FROM jobs").fetchone()
        files = [db, *(_beside(db, s) for s in SIDE)]
        for p in files:
            os.chmod(p, 0o644)
        with caplog.at_level(logging.WARNING, logger="hpcsched.daemon.store.schema"):
            with Store(f"sqlite:///{db}") as store:
                assert store.job("1") is not None
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 3 and all("0644" in m and "0600" in m for m in warned), warned
        # once tight, opening it again says nothing
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hpcsched.daemon.store.schema"):
            with Store(f"sqlite:///{db}") as store:
                store.job("1")
        assert not caplog.records
    finally:
        raw.close()


@pytest.mark.parametrize("before, after", [
    (0o644, 0o600),
    (0o666, 0o600),
    (0o640, 0o600),
    (0o604, 0o600),
    (0o600, 0o600),
    (0o400, 0o400),   # never loosened: no bit is ever added
    (0o444, 0o400),
    (0o700, 0o700),
])
def test_tightening_only_takes_access_away(tmp_path, before, after):
    db = tmp_path / "hpcsched.db"
    db.write_bytes(b"")
    os.chmod(db, before)
    secure_sqlite_file(db)
    assert _mode(db) == after


def test_another_users_store_is_left_alone(tmp_path, monkeypatch):
    """``hpcsched status`` run by a user opens the daemon's store: it must not touch it (it
    could not anyway) nor warn the user about it."""
    db = tmp_path / "hpcsched.db"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    owner = os.stat(db).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    secure_sqlite_file(db)
    assert _mode(db) == 0o644


def test_a_link_beside_the_store_is_not_followed(tmp_path):
    db = tmp_path / "hpcsched.db"
    db.write_bytes(b"")
    os.chmod(db, 0o600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("x")
    os.chmod(elsewhere, 0o644)
    _beside(db, "-wal").symlink_to(elsewhere)
    secure_sqlite_file(db)
    assert _mode(elsewhere) == 0o644


def test_which_urls_name_a_file(tmp_path):
    assert sqlite_file(f"sqlite:///{tmp_path}/x.db") == tmp_path / "x.db"
    assert sqlite_file("sqlite://") is None
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("sqlite:///file:x.db?mode=ro&uri=true") is None
    assert sqlite_file("postgresql+psycopg://u:p@db/hpcsched") is None
    assert (schema.STORE_FILE_MODE, schema.STORE_DIR_MODE) == (0o600, 0o700)


def _posix_locks(*paths) -> int:
    """POSIX locks this process holds on ``paths`` (/proc/locks)."""
    inodes = {os.stat(p).st_ino for p in paths}
    with open("/proc/locks") as f:
        rows = [ln.split() for ln in f]
    return sum(1 for r in rows if r[1] == "POSIX" and int(r[4]) == os.getpid()
               and int(r[5].rsplit(":", 1)[1]) in inodes)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_checking_the_files_keeps_the_locks_of_connections_already_open(tmp_path):
    """A new connection's check (secure_sqlite_file, before each connect) must not take the
    POSIX locks of this process's open connections: closing a descriptor opened on the file for
    reading would (fcntl(2)), and another process could then delete the WAL under them (a
    background checkpoint read a short WAL: SQLITE_IOERR_SHORT_READ, 2026-11-30)."""
    store = Store(f"sqlite:///{tmp_path / 'hpcsched.db'}")
    try:
        store.upgrade()
        os.chmod(tmp_path / "hpcsched.db", 0o644)   # so that the check also tightens a file
        _add_job(store)   # the pooled connection is open: its shared locks are held
        files = [tmp_path / "hpcsched.db", _beside(tmp_path / "hpcsched.db", "-shm")]
        held = _posix_locks(*files)
        assert held > 0
        secure_sqlite_file(tmp_path / "hpcsched.db")
        assert _posix_locks(*files) == held
        assert _mode(tmp_path / "hpcsched.db") == 0o600
    finally:
        store.close()
