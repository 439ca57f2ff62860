"""Rounds at events: for a policy that asks for them (``round_on_events``: ``jct``), the daemon
also runs a round as soon as a managed job ends or a newly submitted one pends, as the
simulator does. The detection is a pure function of two state maps; the wait between rounds
returns early on an event; the daemon's check observes Slurm once and never raises for it.
Slurm is a fake (:class:`FakeCluster` of ``tests/test_daemon_round_nonblocking.py``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.daemon import service as daemon_service
from hpcsched.daemon.between import SubmitStamp
from hpcsched.daemon.config import ConfigError, DaemonSettings, load
from hpcsched.daemon.driving import Steps
from hpcsched.daemon.events import foreign_event, round_event
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.model.snapshot import ForeignJob
from hpcsched.policies.base import PolicyBase
from tests.test_daemon_round_nonblocking import FakeCluster, info, make_job


@pytest.mark.parametrize("before, after, reason", [
    # the last round's managed jobs -> what an observation since sees
    ({"1": "RUNNING", "2": "RUNNING"}, {"2": "RUNNING"}, "job 1 ended"),            # gone
    ({"1": "RUNNING", "2": "RUNNING"}, {"1": "COMPLETED", "2": "RUNNING"}, "job 1 ended"),
    ({"1": "RUNNING", "2": "PENDING"}, {"1": "FAILED", "2": "PENDING"}, "job 1 ended"),
    ({"1": "COMPLETING", "2": "RUNNING"}, {"1": "CANCELLED", "2": "RUNNING"}, "job 1 ended"),
    ({"1": "RUNNING"}, {"1": "RUNNING", "2": "PENDING"}, "job 2 submitted"),
    ({"1": "RUNNING"}, {"1": "COMPLETED", "2": "PENDING"}, "job 1 ended, job 2 submitted"),
    ({}, {"2": "PENDING"}, "job 2 submitted"),
    ({"1": "RUNNING"}, {"1": "RUNNING"}, None),                  # nothing changed
    ({"1": "RUNNING", "2": "PENDING"}, {"1": "RUNNING", "2": "PENDING"}, None),
    ({"1": "PENDING"}, {"1": "RUNNING"}, None),                  # a pending job started
    ({"1": "RUNNING"}, {"1": "PENDING"}, None),                  # requeued by a resize
    ({"1": "RUNNING"}, {"1": "RUNNING", "2": "RUNNING"}, None),  # new, and Slurm started it
    ({"1": "COMPLETED", "2": "RUNNING"}, {"2": "RUNNING"}, None),   # ended before that round
    ({"1": "RUNNING"}, {"1": "COMPLETED"}, None),   # the last job ended: nothing to decide
    ({"1": "RUNNING"}, {}, None),
    ({}, {}, None),
])
def test_round_event(before, after, reason):
    assert round_event(before, after) == reason


def _foreign(job_id: str, user: str = "bob") -> ForeignJob:
    return ForeignJob(job_id, user, nodes=2, gpus_per_node=4, priority=10, partition="gpu")


@pytest.mark.parametrize("before, pending, managed, reason", [
    (frozenset(), [_foreign("30")], {"1": "RUNNING"}, "job 30 of user bob pends"),
    (frozenset({"30"}), [_foreign("30"), _foreign("31", "eve")], {"1": "RUNNING"},
     "job 31 of user eve pends"),
    (frozenset({"30"}), [_foreign("30")], {"1": "RUNNING"}, None),   # seen at the last round
    (frozenset({"30"}), [], {"1": "RUNNING"}, None),                 # it started or left
    (frozenset(), [_foreign("30")], {"1": "PENDING"}, None),   # nothing of ours runs to yield
    (frozenset(), [_foreign("30")], {}, None),
])
def test_foreign_event(before, pending, managed, reason):
    assert foreign_event(before, pending, managed) == reason


# ------------------------------------------------------------------ the wait between rounds
class EventPolicy(PolicyBase):
    name = "events"
    round_on_events = True


class PeriodicPolicy(PolicyBase):
    name = "periodic"


class Stub:
    """The daemon as :func:`_between_rounds` uses it: its policy, resizes in flight advanced,
    and an event check that reports ``event`` from its ``after``-th call on."""

    def __init__(self, policy, event="job 7 ended", after=1):
        self.policy, self.event, self.after = policy, event, after
        self.checks = self.ticks = 0

    def actuate(self):
        self.ticks += 1

    def event_since_round(self):
        self.checks += 1
        return self.event if self.checks >= self.after else None


def _settings(**kw):
    """Tiny intervals (s): a round every 5 s, an event check every 0.05 s."""
    return replace(DaemonSettings(), **{"round_interval": 5.0, "actuation_interval": 0.1,
                                        "event_poll": 0.05, **kw})


def _wait(stub, d) -> tuple[str | None, float]:
    t0 = time.monotonic()
    reason = daemon_service._between_rounds(stub, d, t0, {"stop": False, "reload": False})
    return reason, time.monotonic() - t0


def test_between_rounds_returns_at_an_event(caplog):
    stub = Stub(EventPolicy(), after=3)
    with caplog.at_level(logging.INFO, logger="hpcsched.daemon"):
        reason, waited = _wait(stub, _settings())
    assert reason == "job 7 ended"
    assert 0.15 <= waited < 1.0, waited    # the third check, every 0.05 s: not the 5 s round
    assert stub.checks == 3
    assert "round early: job 7 ended" in caplog.text


def test_between_rounds_checks_once_per_event_poll():
    stub = Stub(EventPolicy(), event=None)
    reason, waited = _wait(stub, _settings(round_interval=0.6, event_poll=0.1,
                                           actuation_interval=0.02))
    assert reason is None and waited >= 0.6
    assert 3 <= stub.checks <= 6, stub.checks   # ~5, not one per 0.02 s nap (~30)


@pytest.mark.parametrize("policy, event_rounds", [
    (PeriodicPolicy(), True),    # the policy does not ask for them
    (EventPolicy(), False),      # turned off
])
def test_between_rounds_waits_the_whole_interval_otherwise(policy, event_rounds):
    stub = Stub(policy)
    reason, waited = _wait(stub, _settings(event_rounds=event_rounds, round_interval=0.5))
    assert reason is None and waited >= 0.5
    assert stub.checks == 0, "no event check, no Slurm observation for it"
    assert stub.ticks >= 2, "resizes in flight are still advanced"


def _stamp_after(path: Path, delays: list[float]) -> threading.Thread:
    """Rewrite ``path`` (a submission, as the job_submit plugin does) after each delay."""
    def run():
        for i, delay in enumerate(delays):
            time.sleep(delay)
            os.utime(path, ns=(0, (i + 1) * 10**9))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_submission_starts_a_look_at_once_not_at_the_next_event_poll(tmp_path):
    """``[daemon] submit_stamp``: another user's submission (the plugin rewrites the file) is
    looked at within a nap, although the next event_poll is a minute away."""
    path = tmp_path / "submitted"
    path.write_text("")
    stamp = SubmitStamp(path)
    stub = Stub(EventPolicy(), event="another user's GPU job 9 pends")
    _stamp_after(path, [0.3])
    t0 = time.monotonic()
    reason = daemon_service._between_rounds(stub, _settings(event_poll=60.0), t0,
                                            {"stop": False, "reload": False}, stamp=stamp)
    waited = time.monotonic() - t0
    assert reason == "another user's GPU job 9 pends" and 0.3 <= waited < 1.0, waited
    assert stub.checks == 1


def test_submissions_start_at_most_one_look_a_second(tmp_path):
    path = tmp_path / "submitted"
    path.write_text("")
    stub = Stub(EventPolicy(), event=None)
    _stamp_after(path, [0.05] * 40)                       # 20 submissions a second, 2 s
    t0 = time.monotonic()
    daemon_service._between_rounds(stub, _settings(event_poll=60.0, round_interval=2.0), t0,
                                   {"stop": False, "reload": False}, stamp=SubmitStamp(path))
    assert 2 <= stub.checks <= 3, stub.checks             # one a SUBMIT_CHECK_GAP (1 s)


def test_no_stamp_or_no_submission_changes_nothing(tmp_path):
    stub = Stub(EventPolicy())
    reason, waited = _wait(stub, _settings(event_poll=60.0, round_interval=0.4))
    assert reason is None and stub.checks == 0
    (tmp_path / "submitted").write_text("")
    missing = SubmitStamp(tmp_path / "absent")
    assert not missing.changed() and not SubmitStamp(tmp_path / "submitted").changed()
    assert not SubmitStamp("").changed()


def test_an_early_round_keeps_the_periodic_rounds_times(tmp_path, monkeypatch):
    """The loop of ``hpcsched daemon``: after an early round the next periodic round is still
    ``round_interval`` after the last periodic one (as in the simulator); after a periodic
    round, after the new one."""
    from click.testing import CliRunner

    waits: list[float] = []
    returns = ["job 7 ended", None, "job 9 submitted", None]

    class Fake:
        policy, backend, control_dir = EventPolicy(), FakeCluster(), tmp_path

        def __init__(self, settings, **kw):
            self.steps = Steps()   # the stop waits for the steps under way (none here)

        def round(self):
            time.sleep(0.01)

    def between(daemon, d, t0, state, hold=None, stamp=None):
        waits.append(t0)
        state["stop"] = len(waits) == len(returns)
        return returns[len(waits) - 1]

    monkeypatch.setattr(daemon_service, "Daemon", Fake)
    monkeypatch.setattr(daemon_service, "_between_rounds", between)
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nlock_file = "{tmp_path / "d.lock"}"\n'
                   f'database_url = "sqlite:///{tmp_path / "h.db"}"\n')
    monkeypatch.setattr(daemon_service.signal, "signal", lambda *a: None)   # pytest's own stay
    root, level = logging.getLogger(), logging.getLogger().level
    try:
        r = CliRunner().invoke(daemon_service.daemon_command, ["--config", str(cfg)])
    finally:
        root.setLevel(level)   # the command sets the daemon's log level
    assert r.exit_code == 0, r.output
    assert waits[0] == waits[1] < waits[2] == waits[3]


# ------------------------------------------------------------------ the daemon's check
@pytest.fixture
def daemon(tmp_path, control_dir, monkeypatch):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\ncontrol_dir = "{control_dir}"\n'
                   f'database_url = "sqlite:///{tmp_path / "h.db"}"\n[policy]\nname = "jct"\n')
    store = Store(load(cfg).daemon.database_url)
    store.upgrade()
    cluster = FakeCluster(info("7"), info("8"))
    make_job(control_dir, "7")
    make_job(control_dir, "8")
    yield Daemon(load(cfg), backend=cluster, store=store), cluster
    store.close()


def test_jct_asks_for_event_rounds(daemon):
    d, _ = daemon
    assert daemon_service._rounds_on_events(d, d.settings.daemon)
    assert not daemon_service._rounds_on_events(d, replace(d.settings.daemon, event_rounds=False))


def test_the_daemon_sees_a_job_end_and_a_submission(daemon, control_dir):
    d, cluster = daemon
    assert d.event_since_round() is None, "no round yet: nothing to compare with"
    assert d.round().error is None
    assert d.event_since_round() is None
    cluster.jobs["7"] = replace(cluster.jobs["7"], state="COMPLETED")
    assert d.event_since_round() == "job 7 ended"
    cluster.jobs["9"] = info("9", "PENDING")
    make_job(control_dir, "9")
    assert d.event_since_round() == "job 7 ended, job 9 submitted"
    cluster.jobs["10"] = info("10", "PENDING")   # not hpcsched's: no job directory
    assert d.round().error is None
    assert d.event_since_round() is None, "the round took them in"


def test_the_event_check_asks_slurm_for_the_jobs_alone(daemon, monkeypatch):
    d, cluster = daemon
    assert d.round().error is None
    asked, real = [], cluster.observe
    monkeypatch.setattr(cluster, "observe", lambda jobs_only=False: asked.append(jobs_only) or real(jobs_only))
    assert d.event_since_round() is None
    assert asked == [True], "squeue alone (1 RPC), not squeue + sinfo (3)"


def test_the_daemon_sees_another_users_job_pend(daemon):
    d, cluster = daemon
    cluster.jobs["20"] = replace(info("20", "PENDING"), user="bob", state_reason="Resources")
    assert d.round().error is None
    assert d.event_since_round() is None, "pending at the last round: already yielded to"
    cluster.jobs["21"] = replace(info("21", "PENDING"), user="eve", state_reason="Priority")
    assert d.event_since_round() == "job 21 of user eve pends"
    cluster.jobs["22"] = replace(info("22", "PENDING"), user="eve",
                                 state_reason="BeginTime")   # not Slurm's to start yet
    assert d.round().error is None
    assert d.event_since_round() is None


def test_the_daemon_check_never_raises_for_slurm(daemon, monkeypatch, caplog):
    d, cluster = daemon
    assert d.round().error is None

    def down(jobs_only=False):
        raise slurm.SlurmUnavailable("Unable to contact slurm controller")

    monkeypatch.setattr(cluster, "observe", down)
    with caplog.at_level(logging.WARNING, logger="hpcsched.daemon"):
        assert d.event_since_round() is None
    assert "Unable to contact slurm controller" in caplog.text
    assert d.round().error is not None
    monkeypatch.undo()
    cluster.jobs["7"] = replace(cluster.jobs["7"], state="COMPLETED")
    assert d.event_since_round() == "job 7 ended", "a failed round keeps the last good map"


# ------------------------------------------------------------------ the settings
def test_settings(tmp_path):
    d = DaemonSettings()
    assert d.event_rounds is True and d.event_poll == 10.0
    p = tmp_path / "hpcsched.toml"
    p.write_text("[daemon]\nevent_rounds = false\nevent_poll = 2\n")
    d = load(p, env={}).daemon
    assert d.event_rounds is False and d.event_poll == 2.0
    for bad, expected in (("event_poll = 0", "a number > 0"),
                          ('event_rounds = "yes"', "a boolean")):
        p.write_text(f"[daemon]\n{bad}\n")
        with pytest.raises(ConfigError, match=expected):
            load(p, env={})
