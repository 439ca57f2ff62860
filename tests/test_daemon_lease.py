"""One daemon per cluster across login nodes (issue 33): the store's lease. A second daemon on
the same store (its own host, so its own lock file) stands by, decides and touches nothing, and
takes over once the first's lease lapses (killed) or is released (a clean stop). Slurm is
unreachable here (every round fails and is recorded; the rounds are what counts)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.daemon.store import Store
from tests.conftest import wait_for

EXE = str(Path(sys.executable).parent / "hpcsched")
LEASE = 3.0
# Slurm never answers here (squeue and scontrol retry a missing SLURM_CONF for 60 s): every
# Slurm call ends on this timeout, whatever its length; 1 s keeps the rounds short (and a's
# renewals, one before each round, closer together than with a longer timeout)
SLURM_TIMEOUT = 1


def test_the_lease_is_one_holders_at_a_time(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    a = store.take_lease("a", 10, now=100.0)
    assert (a.held, a.holder, a.expires_at) == (True, "a", 110.0)
    b = store.take_lease("b", 10, now=105.0)
    assert (b.held, b.holder) == (False, "a")
    assert store.take_lease("a", 10, now=109.0).expires_at == 119.0       # renewed
    assert not store.take_lease("b", 10, now=118.9).held
    assert store.take_lease("b", 10, now=119.1).held                       # lapsed: taken over
    assert not store.take_lease("a", 10, now=120.0).held
    store.release_lease("a")                                               # not a's: nothing
    assert not store.take_lease("a", 10, now=121.0).held
    store.release_lease("b")
    assert store.take_lease("a", 10, now=122.0).held
    with pytest.raises(ValueError):
        store.take_lease("a", 0)


@pytest.fixture
def two(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path}/db.sqlite")
    cfgs = []
    for name in ("a", "b"):   # two login nodes: each its own lock file, one store
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(f'[daemon]\nround_interval = 1\nactuation_interval = 0.5\n'
                       f'lease_seconds = {LEASE}\nlock_file = "{tmp_path}/{name}.lock"\n'
                       f'slurm_timeout = {SLURM_TIMEOUT}\n[policy]\nname = "static"\n')
        cfgs.append(cfg)
    return tmp_path, cfgs


def _start(tmp_path, cfg, name):
    return subprocess.Popen([EXE, "-v", "daemon", "--config", str(cfg)],
                            stdout=open(tmp_path / f"{name}.log", "wb"), stderr=subprocess.STDOUT)


def _rounds_in(log: Path) -> int:
    return sum(1 for ln in log.read_text().splitlines() if " round " in ln and " Slurm call(s)" in ln)


@pytest.mark.parametrize("end", ["killed", "stopped"])
def test_a_standby_takes_over_within_one_lease(two, end):
    tmp_path, (cfg_a, cfg_b) = two
    a = _start(tmp_path, cfg_a, "a")
    b = None
    try:
        wait_for(lambda: _rounds_in(tmp_path / "a.log") >= 1, 60, "a's first round")
        b = _start(tmp_path, cfg_b, "b")
        wait_for(lambda: "standby: the daemon" in (tmp_path / "b.log").read_text(), 60,
                 "b to stand by")
        time.sleep(2 * LEASE)        # a renews; b stays a standby the whole time
        assert _rounds_in(tmp_path / "b.log") == 0 and a.poll() is None
        t = time.monotonic()
        if end == "killed":
            a.send_signal(signal.SIGKILL)    # no release: b waits for the lease to lapse
        else:
            a.send_signal(signal.SIGTERM)    # released: b takes over at its next try
        a.wait(timeout=30)
        wait_for(lambda: _rounds_in(tmp_path / "b.log") >= 1, 30, "b to take over")
        took = time.monotonic() - t
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    log = (tmp_path / "b.log").read_text()
    assert "lease taken: this daemon" in log
    # the lease lapses LEASE s after a's last renewal; b tries every LEASE / 4 s; b's round
    # itself waits for Slurm up to slurm_timeout before it is logged; 2 s more to spare
    assert took <= LEASE + LEASE / 4 + SLURM_TIMEOUT + 2, took
    if end == "stopped":
        assert "lease released" in (tmp_path / "a.log").read_text()
        assert took <= LEASE / 4 + SLURM_TIMEOUT + 2, took


def test_a_daemon_of_this_host_that_died_hands_over_at_once(tmp_path):
    """A restart after a kill on the same host: the dead daemon's pid no longer exists, so its
    lease is taken over without waiting for it to lapse; a live one's (this process) is not."""
    import os
    import socket

    from hpcsched.daemon.leadership import Leadership

    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.upgrade()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname()
    assert store.take_lease(f"{host} pid {dead} abc", 600).held
    restarted = Leadership(store, 600)
    assert restarted.hold(), "the dead daemon's lease is taken over at once"
    assert not Leadership(store, 600, holder=f"{host} pid {os.getpid()} other").hold(), \
        "a live daemon's lease is not (this process holds it)"
    assert not Leadership(store, 600, holder=f"elsewhere pid {dead} x").hold()
