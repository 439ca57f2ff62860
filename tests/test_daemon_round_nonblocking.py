"""The daemon's round acts without waiting for any job: two resizes requested in one round, one
of them slow to answer, each advanced one step per later round on the round's own observation,
journaled at every transition. Slurm is the fake of ``tests/fakes.py`` (the observation and a
:class:`~hpcsched.slurm.control.SlurmControl`); the job files, the journal and the round are real.
The same scenario runs on the dev cluster in ``tests/test_daemon_actuation_slurm.py``."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace

import pytest

from hpcsched import slurm
from hpcsched.daemon import ingest
from hpcsched.daemon import round as daemon_round
from hpcsched.daemon import service as daemon_service
from hpcsched.daemon.actuator import Actuator
from hpcsched.daemon.config import load
from hpcsched.daemon.driving import IN_FLIGHT
from hpcsched.daemon.phases import PATHS, REQUEUE_START_DELAY_S, Timeouts
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.model.snapshot import JobTarget, Plan
from hpcsched.policies.base import PolicyBase
from hpcsched.policies.reconcile import Change
from hpcsched.policies.round import RoundDecision
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.kinds import ChangeKind, ControlAction
from hpcsched.protocol.limits import JobLimits
from tests.fakes import FakeSlurm

ME = current_user()   # Slurm's user of the test jobs: they live in this user's subtree


def info(job_id, state="RUNNING", node_count=1, restarts=0) -> slurm.JobInfo:
    return slurm.JobInfo(job_id=job_id, name="", user=ME, state=state, state_reason="None",
                         partition="gpu", nodes="n1" if state == "RUNNING" else "",
                         node_count=node_count, gpus_per_node=2, restarts=restarts,
                         batch_host="n1", priority=1)


def FakeCluster(*infos: slurm.JobInfo) -> FakeSlurm:
    """Slurm for the round (``observe``) and for the actuator (:class:`SlurmControl`), the one
    fake of ``tests/fakes.py``: the round's observation must do (no second squeue), and no
    hold, release or cancel."""
    return FakeSlurm(*infos, forbid=("job", "hold", "release", "cancel"))


def answer(jd: JobDir, cluster: FakeSlurm, job_id: str) -> None:
    """The job's side: acknowledge the generation as ElasticJob and the launcher do."""
    c = ctl.read_control(jd.control_path, jd.uid)
    a = ctl.read_ack(jd.ack_path, jd.uid)
    if c is None or a.generation > c.generation or (a.generation == c.generation
                                                    and a.state == "applied"):
        return
    state = None
    if a.generation < c.generation:
        state = "applied" if c.action == ControlAction.CONTINUE else "checkpointed"
    elif cluster.jobs[job_id].state == "RUNNING" and cluster.jobs[job_id].restarts:
        state = "applied"   # requeued and running again at the new size
    if state:
        ctl.write_ack(jd.ack_path, ctl.Ack(
            job_uid=jd.uid, generation=c.generation, state=state, world_size=2 * c.nodes,
            nodes=c.nodes, global_batch_size=c.global_batch_size,
            local_batch_size=c.local_batch_size, accumulation_steps=c.accumulation_steps,
            step=3, time=time.time()))


def make_job(control_dir, job_id) -> JobDir:
    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script="/s/train.py", script_args=(), python="python3",
                         submit_dir="/s", sbatch_args=(), nodes=1,
                         limits=JobLimits(2, 1, 2, 16, 256, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "ck"), user="bob"))
    d.link_job_id(job_id)
    ctl.write_ack(d.ack_path, ctl.Ack(job_uid=d.uid, generation=0, state="applied", world_size=2,
                                      nodes=1, global_batch_size=64, local_batch_size=32,
                                      accumulation_steps=1, step=0, time=time.time()))
    return d


@pytest.fixture
def daemon(tmp_path, control_dir, monkeypatch):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\ncontrol_dir = "{control_dir}"\n'
                   f'database_url = "sqlite:///{tmp_path / "h.db"}"\n[policy]\nname = "static"\n')
    settings = load(cfg)
    store = Store(settings.daemon.database_url)
    store.upgrade()
    cluster = FakeCluster(info("7"), info("8"))
    d = Daemon(settings, backend=cluster, store=store)
    shift = [0.0]   # the actuator's clock runs ahead of the wall clock by this (s)
    d.actuator = Actuator(cluster, Timeouts(ack=180, start=300), lambda: time.time() + shift[0])
    yield d, cluster, shift
    store.close()


def test_two_resizes_in_one_round_proceed_over_later_rounds(daemon, control_dir, monkeypatch):
    d, cluster, shift = daemon
    jobs = {"7": make_job(control_dir, "7"), "8": make_job(control_dir, "8")}
    changes = (Change("7", "grow", 1, 2, 64, 64, "test: grow"),
               Change("8", "batch", 1, 1, 64, 128, "test: batch, slow to answer"))
    snapshots = []

    def decide(snapshot, policy, costs, seed):
        snapshots.append(snapshot)
        return RoundDecision(None, changes if len(snapshots) == 1 else (), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)

    def phases():
        return {a.job_id: a.phase for a in d.store.actions()}

    rep = d.round()
    assert rep.error is None and rep.outcomes == {"7": "requested", "8": "requested"}
    # every part of the round is timed (the scale benchmark's table), and no part twice
    assert set(rep.phases) == set(daemon_round.PHASES)
    assert all(v >= 0 for v in rep.phases.values()) and sum(rep.phases.values()) <= rep.duration
    assert [ctl.read_control(jd.control_path, jd.uid).generation for jd in jobs.values()] == [1, 1]
    assert cluster.calls == [], "nothing but files in the round that decided"

    seen = [phases()]
    for _ in range(6):
        answer(jobs["7"], cluster, "7")          # job 8 is slow: it answers after round 4
        if len(seen) > 4:
            answer(jobs["8"], cluster, "8")
        shift[0] += 1.5                           # rounds 1.5 s apart
        rep = d.round()
        assert rep.error is None
        seen.append(phases())
        if set(seen[-1].values()) == {"running"}:
            break
    assert seen == [
        {"7": "requested", "8": "requested"},
        {"7": "requeued", "8": "requested"},      # checkpointed and requeued in one step
        {"7": "released", "8": "requested"},
        {"7": "rescheduled", "8": "requested"},
        {"7": "running", "8": "requested"},
        {"7": "running", "8": "running"},
    ]
    for a in d.store.actions():
        assert tuple(p for p, _ in a.history) == PATHS[ChangeKind(a.kind)], a
    assert [(c[0], c[1]) for c in cluster.calls] == [("requeue", "7")] + [("update", "7")] * 3
    assert all(j.busy for j in snapshots[1].jobs), "a job with an open action is busy"
    # busy: an action open when the round began (8 ran at its new batch size in this round)
    assert {j.job_id: j.busy for j in snapshots[-1].jobs} == {"7": False, "8": True}
    d.round()
    assert {j.job_id: j.busy for j in snapshots[-1].jobs} == {"7": False, "8": False}


def test_actuate_between_rounds_advances_open_resizes_and_decides_nothing(daemon, control_dir,
                                                                          monkeypatch):
    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    decisions = []

    def decide(snapshot, policy, costs, seed):
        decisions.append(snapshot)
        return RoundDecision(None, (Change("7", "grow", 1, 2, 64, 64, "test: grow"),)
                             if len(decisions) == 1 else (), ())

    observed = []
    real_observe = cluster.observe
    monkeypatch.setattr(cluster, "observe", lambda: observed.append(1) or real_observe())
    monkeypatch.setattr(daemon_round, "decide_round", decide)
    assert d.actuate() == {} and observed == [], "no open resize: no Slurm call at all"
    d.round()
    phases = []
    for _ in range(6):
        answer(jd, cluster, "7")
        shift[0] += 1.5
        outcome = d.actuate()
        phases.append(outcome["7"])
        if outcome["7"] == "running":
            break
    assert phases == ["requeued", "released", "rescheduled", "running"]
    assert len(decisions) == 1, "actuate decides nothing"
    assert len(observed) == 1 + len(phases), "one observation per round and per tick"
    assert d.actuate() == {}, "nothing open any more"
    assert len(observed) == 1 + len(phases)


def test_a_step_the_round_stopped_waiting_for_is_left_to_its_thread(daemon, control_dir,
                                                                   monkeypatch):
    """Job 8's control file cannot be written for a while (a file system that stalls): the
    round waits ``step_wait`` for it, then returns with job 7's step done; later rounds leave
    job 8's action to the step under way (not taken twice, the job busy); the tick after it
    ends journals it, and the next round takes the action's next step."""
    d, cluster, shift = daemon
    jobs = {"7": make_job(control_dir, "7"), "8": make_job(control_dir, "8")}
    d.settings = replace(d.settings, daemon=replace(d.settings.daemon, step_wait=0.3))
    gate, steps = threading.Event(), []
    real_advance = d.actuator.advance

    def advance(action, *args, **kw):
        steps.append(action.job_id)
        if action.job_id == "8" and steps.count("8") == 1:
            assert gate.wait(30)
        return real_advance(action, *args, **kw)

    monkeypatch.setattr(d.actuator, "advance", advance)
    snapshots = []

    def decide(snapshot, policy, costs, seed):
        snapshots.append(snapshot)
        return RoundDecision(None, (Change("7", "batch", 1, 1, 64, 128, "test: batch"),
                                    Change("8", "batch", 1, 1, 64, 128, "test: batch"))
                             if len(snapshots) == 1 else (), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)
    rep = d.round()
    assert rep.outcomes == {"7": "requested", "8": IN_FLIGHT}
    assert 0.3 <= rep.step_waited < 5 and rep.duration < 10
    assert ctl.read_control(jobs["8"].control_path, jobs["8"].uid) is None
    answer(jobs["7"], cluster, "7")
    rep = d.round()
    assert rep.outcomes == {"7": "running", "8": IN_FLIGHT}
    assert steps == ["7", "8", "7"], "a step under way is not taken again"
    assert {j.job_id: j.busy for j in snapshots[-1].jobs} == {"7": True, "8": True}
    gate.set()
    deadline = time.monotonic() + 30
    while not (out := d.actuate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert out == {"8": "requested"}
    assert ctl.read_control(jobs["8"].control_path, jobs["8"].uid).generation == 1
    answer(jobs["8"], cluster, "8")
    rep = d.round()
    assert rep.outcomes == {"8": "running"} and steps == ["7", "8", "7", "8"]
    assert {a.job_id: a.phase for a in d.store.actions()} == {"7": "running", "8": "running"}


def test_a_tick_asks_slurm_nothing_for_a_resize_whose_step_is_under_way(daemon, control_dir,
                                                                       monkeypatch):
    """A grow past ``requested`` needs Slurm at every tick, but not while its step is still
    under way in its thread: the tick then neither observes Slurm nor steps it."""
    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    d.settings = replace(d.settings, daemon=replace(d.settings.daemon, step_wait=0.2))
    gate, steps = threading.Event(), []
    real_advance = d.actuator.advance

    def advance(*args, **kw):
        steps.append(1)
        if len(steps) == 3:   # the grow's third step: requeued, waiting for the job to pend
            assert gate.wait(30)
        return real_advance(*args, **kw)

    monkeypatch.setattr(d.actuator, "advance", advance)
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(
        None, (Change("7", "grow", 1, 2, 64, 64, "test: grow"),), ()))
    d.round()
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(None, (), ()))
    answer(jd, cluster, "7")
    shift[0] += 1.5
    assert d.round().outcomes == {"7": "requeued"}
    shift[0] += 1.5
    assert d.round().outcomes == {"7": IN_FLIGHT}
    observed = []
    real_observe = cluster.observe
    monkeypatch.setattr(cluster, "observe", lambda: observed.append(1) or real_observe())
    assert d.actuate() == {} and observed == [] and len(steps) == 3
    # past the requeue's start delay whatever the wall clock's fraction of a second (the
    # release's next step waits for it: phases.requeue_start_due)
    shift[0] += REQUEUE_START_DELAY_S
    gate.set()
    deadline = time.monotonic() + 30
    while not (out := d.actuate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # the step that was under way journaled (released), and the next one taken at once
    assert out == {"7": "rescheduled"} and observed == [1] and len(steps) == 4
    assert [p for p, _ in d.store.actions()[0].history][-2:] == ["released", "rescheduled"]
    assert d.actuate() != {} and observed == [1, 1], "then every tick observes"


def test_a_tick_asks_slurm_nothing_while_every_resize_waits_for_its_job(daemon, control_dir,
                                                                         monkeypatch):
    """A resize waiting for the job's acknowledgement needs no Slurm: ticks stat the job's
    ack.json only, until the job answers (or the acknowledgement is due)."""
    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(
        None, (Change("7", "grow", 1, 2, 64, 64, "test: grow"),), ()))
    observed = []
    real_observe = cluster.observe
    monkeypatch.setattr(cluster, "observe", lambda: observed.append(1) or real_observe())
    d.round()
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(None, (), ()))
    assert [a.phase for a in d.store.open_actions()] == ["requested"]
    for _ in range(3):
        assert d.actuate() == {}
    assert observed == [1], "three ticks, no observation: the job has not answered"
    time.sleep(0.01)
    answer(jd, cluster, "7")   # it checkpointed: the next tick takes the requeue step
    assert d.actuate() == {"7": "requeued"} and observed == [1, 1]
    assert d.actuate() != {} and len(observed) == 3, "past requested: every tick observes"


def test_the_resize_journal_is_synced_and_the_bookkeeping_is_not(daemon, control_dir,
                                                                   monkeypatch):
    """Every journal write of the round commits with ``synchronous=FULL`` (written ahead, it
    must outlive the host); the jobs' records and the round's own row commit ``NORMAL``
    (the next round writes them again), so a round with no change syncs nothing."""
    from sqlalchemy import text

    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(
        None, (Change("7", "grow", 1, 2, 64, 64, "test: grow"),), ()))
    levels: dict[str, set] = {}
    real_commit = d.store._commit
    committers = ("begin_round", "end_round", "sweep", "_keep_up", "_land", "_round")

    def commit(s):   # who commits, and the level it commits at
        level = s.execute(text("PRAGMA synchronous")).scalar_one()
        f = sys._getframe(1)
        while f is not None and f.f_code.co_name not in committers:
            f = f.f_back
        levels.setdefault(f.f_code.co_name if f else "(other)", set()).add(level)
        real_commit(s)

    for name in ("plan_action", "set_action_phase"):
        real = getattr(d.store, name)

        def spy(*a, _real=real, _name=name, **k):
            level = d.store._batch.execute(text("PRAGMA synchronous")).scalar_one() \
                if d.store._batch is not None else 2   # its own transaction: durable (default)
            levels.setdefault(_name, set()).add(level)
            return _real(*a, **k)
        monkeypatch.setattr(d.store, name, spy)
    monkeypatch.setattr(d.store, "_commit", commit)
    d.round()
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a: RoundDecision(None, (), ()))
    for _ in range(6):
        answer(jd, cluster, "7")
        shift[0] += 1.5
        d.round()
        if d.store.actions()[0].phase == "running":
            break
    assert d.store.actions()[0].phase == "running"
    assert levels["plan_action"] == levels["set_action_phase"] == {2}
    levels.pop("sweep", None)   # the hourly sweep of old jobs' rows: as any other write
    assert levels == {"plan_action": {2}, "set_action_phase": {2},
                      "_round": {2}, "_land": {2},   # the journal's two commits
                      "begin_round": {1}, "_keep_up": {1}, "end_round": {1}}, levels
    assert d.store.commit_seconds > 0
    # and after each round, the WAL is copied into the database file in a thread of its own
    assert d.checkpoint.wait(timeout=30) and d.checkpoint.last is not None


class Scripted(PolicyBase):
    """A policy that gives job 7 the node counts of ``script``, one per round (the last one
    after that), at batch 64; it records what it saw."""

    name = "scripted"

    def __init__(self, *script):
        self.script = list(script)
        self.seen = []

    def decide(self, snapshot, seed=0):
        self.seen.append(snapshot)
        nodes = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return Plan(self.name, (JobTarget("7", nodes, 64, f"scripted: {nodes} node(s)"),))


def test_the_round_preempts_holds_with_a_deadline_and_releases_when_the_plan_says(daemon,
                                                                                  control_dir):
    """Real reconcile with the daemon's costs: a plan's 0 nodes for a running job is a preempt
    (checkpoint, requeue, StartTime=now+<deadline>); the held job is in the next snapshots as
    ``held`` (pending with reason BeginTime, not busy), and a plan that gives it nodes again
    releases it (its generation, then StartTime=now)."""
    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    d.policy = policy = Scripted(0, 0, 0, 0, 1)   # asked in every round that has a job to plan
    d.actuator.timeouts = Timeouts(ack=180, start=300, hold=1234)
    assert d.costs.preemption, "the daemon applies preemptions"
    outcomes = []
    for _ in range(10):
        outcomes.append(d.round().outcomes.get("7"))
        answer(jd, cluster, "7")
        shift[0] += 2.5   # a round is always at least 2 s after the requeue before it
        if [a.kind for a in d.store.actions() if a.phase == "running"] == ["pending", "preempt"]:
            break
    # preempt: requested; checkpointed and requeued (the job pends, busy: not planned for, the
    # policy is not asked); held (2 s after the requeue). Rounds whose plan gives the held job
    # 0 nodes change nothing; the release: requested, running
    assert outcomes == ["requested", "requeued", "running", None, None, "requested", "running"]
    kinds = [(a.kind, a.phase, tuple(p for p, _ in a.history)) for a in reversed(d.store.actions())]
    assert kinds == [("preempt", "running", PATHS[ChangeKind.PREEMPT]),
                     ("pending", "running", PATHS[ChangeKind.PENDING])]
    assert [(c[0], c[2] if len(c) > 2 else None) for c in cluster.calls] == [
        ("requeue", None),
        ("update", {"NumNodes": "1-1", "NumTasks": 2, "NumCPUs": 2, "ReqNodeList": ""}),
        ("update", {"StartTime": "now+1234"}),
        ("update", {"StartTime": "now"})]
    held = [s.job("7") for s in policy.seen if s.job("7") is not None and s.job("7").held]
    assert held and all(j.state == "PENDING" and not j.busy for j in held)
    controls = ctl.read_control(jd.control_path, jd.uid)
    assert (controls.generation, controls.action) == (2, ControlAction.CONTINUE)
    assert ctl.read_ack(jd.ack_path, jd.uid).generation == 2


def test_a_held_job_is_left_alone_while_the_plan_gives_it_nothing(daemon, control_dir):
    """Preempted and held: rounds that still give it 0 nodes change nothing (the deadline stays
    the guard), and a job pending for its begin time that hpcsched did not preempt is not
    planned for at all."""
    d, cluster, shift = daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    cluster.jobs["8"] = replace(cluster.jobs["8"], state="PENDING", state_reason="BeginTime")
    d.policy = policy = Scripted(0)
    for _ in range(6):
        d.round()
        answer(jd, cluster, "7")
        shift[0] += 1.5
    assert [(a.kind, a.phase) for a in d.store.actions()] == [("preempt", "running")]
    assert cluster.calls[-1] == ("update", "7", {"StartTime": "now+1800"})
    last = policy.seen[-1]
    assert last.job("7").held and last.job("8") is None


def test_between_rounds_ticks_every_actuation_interval_until_the_next_round():
    class Counting:
        ticks = 0

        def actuate(self):
            self.ticks += 1

    settings = replace(load(None).daemon, round_interval=0.6, actuation_interval=0.1)
    d = Counting()
    t0 = time.monotonic()
    daemon_service._between_rounds(d, settings, t0, {"stop": False, "reload": False})
    assert 0.6 <= time.monotonic() - t0 < 1.5
    assert 2 <= d.ticks <= 6, d.ticks   # ~5; fewer only if the machine is very slow
    stopped = Counting()
    daemon_service._between_rounds(stopped, settings, time.monotonic(), {"stop": True, "reload": False})
    assert stopped.ticks == 0


@pytest.mark.parametrize("journal, job, held", [
    # (kind, phase) oldest first; Slurm's view of the job
    ([("preempt", "running")], info("7", "PENDING", restarts=1), True),
    ([("preempt", "running"), ("pending", "failed")], info("7", "PENDING", restarts=1), True),
    ([("preempt", "running"), ("pending", "running")], info("7", "PENDING", restarts=1), False),
    ([("preempt", "running")], info("7", "PENDING", restarts=0), False),   # not requeued yet
    ([("preempt", "running")], info("7", "RUNNING", restarts=1), False),   # the guard started it
    ([("preempt", "failed")], info("7", "PENDING", restarts=1), False),
    ([("preempt", "requeued")], info("7", "PENDING", restarts=1), False),  # still open: busy
    ([("grow", "running")], info("7", "PENDING", restarts=1), False),
    ([], info("7", "PENDING", restarts=1), False),
])
def test_held_after_preemption_reads_the_journal(tmp_path, journal, job, held):
    from hpcsched.daemon.views import eligible, held_after_preemption

    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    store.upsert_job(job_id="7", job_uid="u", workers_per_node=2, min_nodes=1, max_nodes=2,
                     min_batch_size=16, max_batch_size=256, base_batch_size=64)
    path = {"preempt": PATHS[ChangeKind.PREEMPT], "pending": PATHS[ChangeKind.PENDING],
            "grow": PATHS[ChangeKind.GROW]}
    for kind, phase in journal:
        aid = store.plan_action(job_id="7", kind=kind, generation=1, from_nodes=1, to_nodes=0,
                                from_batch_size=64, to_batch_size=64, restarts_at_plan=0)
        steps = path[kind][1:path[kind].index(phase) + 1] if phase != "failed" else ("failed",)
        for p in steps:
            store.set_action_phase(aid, p)
    job = replace(job, state_reason="BeginTime" if job.state == "PENDING" else "None")
    assert held_after_preemption(job, store) == held
    assert eligible(job, held) == (held or job.state == "RUNNING")
    store.close()


def _journal_of_job_7(tmp_path, journal) -> Store:
    """A store whose job 7 has the journal ``journal``: (kind, phase[, from, to nodes]), oldest
    first, each entry taken along its kind's path up to that phase."""
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    store.upsert_job(job_id="7", job_uid="u", workers_per_node=2, min_nodes=1, max_nodes=2,
                     min_batch_size=16, max_batch_size=256, base_batch_size=64)
    for kind, phase, *nodes in journal:
        from_nodes, to_nodes = nodes or (1, 2)
        aid = store.plan_action(job_id="7", kind=kind, generation=1, from_nodes=from_nodes,
                                to_nodes=to_nodes, from_batch_size=64, to_batch_size=64,
                                restarts_at_plan=0)
        path = PATHS[ChangeKind(kind)]
        steps = path[1:path.index(phase) + 1] if phase != "failed" else ("failed",)
        for p in steps:
            store.set_action_phase(aid, p)
    return store


@pytest.mark.parametrize("journal, last", [
    # (kind, phase) oldest first -> the direction reconcile's no-thrash hold reads
    ([("grow", "running")], "grow"),
    ([("shrink", "running")], "shrink"),
    ([("grow", "running"), ("shrink", "running")], "shrink"),
    ([("shrink", "running"), ("batch", "running")], "shrink"),   # a batch change keeps the size
    ([("shrink", "running"), ("grow", "failed")], "shrink"),     # a failed grow changed nothing
    ([("shrink", "running"), ("grow", "requeued")], None),       # in flight: the job is busy
    ([("preempt", "running"), ("pending", "running")], "grow"),  # released after a preemption
    ([("pending", "running")], None),                            # sized before its first start
    ([("grow", "running"), ("preempt", "running")], None),
    ([("shrink", "running"), ("reform", "running", 1, 2)], "grow"),   # grown by extension
    ([("grow", "running"), ("reform", "running", 2, 1)], "shrink"),   # extension given back
    ([("grow", "running"), ("reform", "running", 2, 2)], None),       # moved, same size
    ([], None),
])
def test_last_resize_reads_the_journal(tmp_path, journal, last):
    from hpcsched.daemon.views import last_resize

    store = _journal_of_job_7(tmp_path, journal)
    assert last_resize("7", store) == last
    store.close()


@pytest.mark.parametrize("journal, failed", [
    ([("grow", "failed")], True),
    ([("shrink", "running"), ("reform", "failed", 1, 2)], True),     # an extension refused
    ([("grow", "failed"), ("batch", "running")], True),              # a batch change: skipped
    ([("reform", "failed", 2, 1)], False),                           # a failed shrink
    ([("grow", "failed"), ("grow", "running")], False),              # grown since
    ([("shrink", "failed")], False),
    ([], False),
])
def test_grow_failed_at_reads_the_journal(tmp_path, journal, failed):
    from hpcsched.daemon.views import grow_failed_at

    store = _journal_of_job_7(tmp_path, journal)
    at = grow_failed_at("7", store)
    assert (at is not None) == failed
    if failed:
        assert at == pytest.approx(time.time(), abs=60)
    store.close()


def test_a_job_that_requeued_itself_during_a_batch_change_is_started_at_once(daemon, control_dir,
                                                                             monkeypatch):
    """Found by the chaos replay: a job that requeues itself on Slurm's pre-timeout signal while
    a resize that is no requeue (here a batch change) is open used to wait out Slurm's 121 s
    hold; only the daemon's own requeues set the start time themselves."""
    from hpcsched.protocol.kinds import LauncherPhase

    d, cluster, _ = daemon
    jd = make_job(control_dir, "7")
    changes = (Change("7", "batch", 1, 1, 64, 128, "test: batch"),)
    calls = []

    def decide(snapshot, policy, costs, seed):
        calls.append(snapshot)
        return RoundDecision(None, changes if len(calls) == 1 else (), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)
    assert d.round().outcomes == {"7": "requested"}
    # Slurm's signal: the job checkpoints, its launcher requeues it and says so
    cluster.jobs["7"] = replace(cluster.jobs["7"], state="PENDING", nodes="", restarts=1,
                                state_reason="BeginTime")
    ctl.write_launcher_state(jd.launcher_path, ctl.LauncherState(
        job_uid=jd.uid, job_id="7", phase=LauncherPhase.REQUEUED, launches=1, resizes=0,
        restarts=0, time=time.time() - 5, nodelist="n1"))
    d.round()
    assert ("update", "7", {"StartTime": "now"}) in cluster.calls
    assert cluster.jobs["7"].state == "RUNNING"


@pytest.mark.parametrize("slurm_answers", [True, False])
def test_the_round_reads_another_users_planned_nodes_and_goes_on_without(
        daemon, control_dir, monkeypatch, caplog, slurm_answers):
    """Another user's job waits with a planned start whose nodes the observation lacks (Slurm
    22.05's JSON): the round asks once (Backend.with_planned_nodes) and the snapshot's foreign
    job has them; where Slurm does not answer, the round goes on, the job without them."""
    d, cluster, _ = daemon
    make_job(control_dir, "7")
    make_job(control_dir, "8")
    cluster.jobs["90"] = replace(info("90", state="PENDING"), user="carol", state_reason="Resources",
                                 gpus_per_node=4, start_time=time.time() + 600)
    asked = []

    def with_planned_nodes(obs):
        asked.append(obs.jobs["90"].scheduled_nodes)
        if not slurm_answers:
            raise slurm.SlurmUnavailable("squeue: Socket timed out on send/recv operation")
        jobs = {**obs.jobs, "90": replace(obs.jobs["90"], scheduled_nodes="n2")}
        return replace(obs, jobs=jobs, calls=obs.calls + 1)

    monkeypatch.setattr(cluster, "with_planned_nodes", with_planned_nodes)
    rep = d.round()
    assert rep.error is None and asked == [None]
    (foreign,) = rep.snapshot.foreign_pending
    assert foreign.scheduled_nodes == (("n2",) if slurm_answers else ())
    assert ("planned starts not read" in caplog.text) is not slurm_answers


def test_the_round_reads_its_running_jobs_metrics_within_their_budgets_and_forgets_ended_jobs(
        daemon, control_dir, monkeypatch):
    """Each round reads every running job's newest metrics within its budget
    (:class:`~hpcsched.daemon.ingest.Budgets`), and remembers no job Slurm no longer lists."""
    d, cluster, _ = daemon
    make_job(control_dir, "7"), make_job(control_dir, "8")
    asked = []
    real = daemon_round.ingest_jobs
    monkeypatch.setattr(daemon_round, "ingest_jobs",
                        lambda store, jobs, sink, budgets: asked.append(budgets) or real(store, jobs, sink, budgets))
    d.round()
    assert asked[-1] == {"7": ingest.FRESH_BYTES, "8": ingest.FRESH_BYTES}   # first seen: the full window
    d.round()   # at once: each job's least
    assert asked[-1] == {"7": ingest.MIN_FILE_WINDOW, "8": ingest.MIN_FILE_WINDOW}
    cluster.jobs.pop("8")
    d.round()
    assert "7" in d.budgets and "8" not in d.budgets
