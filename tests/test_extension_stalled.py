"""When a pending grow is given up (``Extender.stalled``, ``hpcsched.job.extension``, the rule
the real job and the scale stand-in share): an extension that ended, one that did not start in
``EXTENSION_TIMEOUT`` seconds or by ``ACK_MARGIN_S`` before the control's ``ack_by``, and one
that cannot start because another job holds its node's GPUs, once it has pended
``EXTENSION_BLOCKED`` seconds, so that the grow's other extensions do not hold their GPUs idle
until the timeout. Slurm is faked here (its answers only); the dev-cluster tests are
``tests/test_extensions_slurm.py``'s ``timeout``, ``deadline`` and ``blocked``."""

from __future__ import annotations

import time

import pytest

from hpcsched import slurm
from hpcsched.job import extension
from hpcsched.job.extension import Extender
from hpcsched.model.snapshot import NodeView
from hpcsched.protocol.extensions import Extension, ExtensionState
from hpcsched.slurm.parse import JobInfo


def _job(job_id: str, state: str, reason: str = "None") -> JobInfo:
    return JobInfo(job_id=job_id, name="x+ext", user="alice", state=state, state_reason=reason,
                   partition="gpu", nodes="", node_count=1, gpus_per_node=0, restarts=0,
                   batch_host="", priority=1)


def _ext(job_id: str, node: str, gpus: int) -> Extension:
    return Extension(job_id, node, gpus, 1, ExtensionState.SUBMITTED, 0.0, 0.0)


class _Extender(Extender):
    """The real rule over faked answers: ``states`` for the ``squeue``, or an error."""

    def __init__(self, states: dict[str, JobInfo] | Exception, active: list[Extension]):
        self.states, self.items = states, active

    def slurm_states(self):
        if isinstance(self.states, Exception):
            raise self.states
        return self.states


@pytest.fixture
def nodes(monkeypatch):
    """``slurm.nodes()`` answers with these nodes; counts its calls."""
    answer: dict = {"nodes": (), "calls": 0}

    def fake(timeout=slurm.DEFAULT_TIMEOUT):
        answer["calls"] += 1
        return answer["nodes"]

    monkeypatch.setattr(slurm, "nodes", fake)
    return answer


def test_an_extension_on_a_node_others_hold_gives_up_the_grow(nodes):
    nodes["nodes"] = (NodeView("n1", 4, 0, "idle"), NodeView("n4", 4, 4, "allocated"))
    m = _Extender({"11": _job("11", "RUNNING"), "12": _job("12", "PENDING", "Resources")},
                  [_ext("11", "n1", 4), _ext("12", "n4", 3)])
    t = extension.EXTENSION_BLOCKED
    why = m.stalled(("11", "12"), t)
    assert why is not None and why.startswith(
        "extension job 12 cannot start: n4 has 0 free GPU(s), it needs 3"), why
    # before EXTENSION_BLOCKED seconds Slurm may still be starting it: Slurm's nodes not asked
    nodes["calls"] = 0
    assert m.stalled(("11", "12"), t - 1) is None and nodes["calls"] == 0


@pytest.mark.parametrize("n4", [NodeView("n4", 4, 1, "mixed"), NodeView("n4", 4, 0, "idle")])
def test_an_extension_whose_node_has_room_waits_for_slurm(nodes, n4):
    """Room on its node: Slurm has not started it yet, or keeps the GPUs for a job ahead of it;
    the grow waits (EXTENSION_TIMEOUT)."""
    nodes["nodes"] = (n4,)
    m = _Extender({"12": _job("12", "PENDING", "Priority")}, [_ext("12", "n4", 3)])
    assert m.stalled(("12",), extension.EXTENSION_BLOCKED + 5) is None
    assert nodes["calls"] == 1


def test_no_pending_extension_asks_slurm_for_no_node(nodes):
    m = _Extender({"11": _job("11", "RUNNING")}, [_ext("11", "n1", 4)])
    assert m.stalled(("11",), 60.0) is None
    assert nodes["calls"] == 0


def test_a_slurm_that_does_not_answer_is_no_reason_to_give_up(monkeypatch):
    def down(timeout=slurm.DEFAULT_TIMEOUT):
        raise slurm.SlurmUnavailable("sinfo: timed out")

    monkeypatch.setattr(slurm, "nodes", down)
    m = _Extender({"12": _job("12", "PENDING", "Resources")}, [_ext("12", "n4", 3)])
    assert m.stalled(("12",), extension.EXTENSION_BLOCKED) is None


@pytest.mark.parametrize("listed", [None, "CANCELLED", "COMPLETED"])
def test_an_extension_that_ended_before_joining_gives_up_the_grow(listed):
    states = {} if listed is None else {"12": _job("12", listed)}
    m = _Extender(states, [_ext("12", "n4", 3)])
    assert m.stalled(("12",), 1.0) == (
        f"extension job 12 is {listed or 'gone'} before its workers joined")


def test_an_extension_not_started_in_time_gives_slurms_reason(nodes):
    nodes["nodes"] = (NodeView("n4", 4, 0, "idle"),)
    m = _Extender({"12": _job("12", "PENDING", "Priority")}, [_ext("12", "n4", 3)])
    assert m.stalled(("12",), extension.EXTENSION_TIMEOUT) is None
    why = m.stalled(("12",), extension.EXTENSION_TIMEOUT + 1)
    assert why == (f"extension job 12 did not start within {extension.EXTENSION_TIMEOUT:.0f} s "
                   "(Slurm: PENDING, reason Priority)")


def test_an_unanswered_squeue_waits_until_the_timeout():
    """slurmctld busy (1,024 GPUs in benchmarks/daemon_scale.py): asked again at the next look,
    but a grow does not wait past the timeout for a Slurm that never answers."""
    m = _Extender(slurm.SlurmUnavailable("squeue: timed out"), [_ext("12", "n4", 3)])
    assert m.stalled(("12",), extension.EXTENSION_BLOCKED + 1) is None
    why = m.stalled(("12",), extension.EXTENSION_TIMEOUT + 1)
    assert why is not None and why.startswith("extension job(s) 12 did not start within") \
        and "Slurm did not answer: squeue: timed out" in why, why


def test_a_grow_is_given_up_in_time_to_answer_before_hpcscheds_deadline(nodes):
    """The control's ``ack_by``: an extension Slurm keeps pending (its node has room) is given
    up ACK_MARGIN_S before hpcsched stops waiting, with Slurm's reason, well within
    EXTENSION_TIMEOUT; no deadline (0, a control written before the field existed) or a far
    one leaves the grow waiting."""
    nodes["nodes"] = (NodeView("n4", 4, 0, "idle"),)
    m = _Extender({"12": _job("12", "PENDING", "Priority")}, [_ext("12", "n4", 3)])
    now = time.time()
    for ack_by in (0.0, now + extension.ACK_MARGIN_S + 60):
        assert m.stalled(("12",), 150.0, ack_by) is None
    why = m.stalled(("12",), 150.0, now + extension.ACK_MARGIN_S - 1)
    assert why == ("extension job 12 did not start within 150 s, by when hpcsched needs the "
                   "job's answer (Slurm: PENDING, reason Priority)")


def test_out_of_time_is_the_earlier_of_the_timeout_and_the_deadline_less_its_margin():
    t, margin = extension.EXTENSION_TIMEOUT, extension.ACK_MARGIN_S
    assert extension.out_of_time(t, 0.0, 1000.0) == ""
    assert extension.out_of_time(t + 1, 0.0, 1000.0) == f"within {t:.0f} s"
    assert extension.out_of_time(t + 1, 5000.0, 1000.0) == f"within {t:.0f} s"   # timeout first
    assert extension.out_of_time(10.0, 1000.0 + margin + 0.5, 1000.0) == ""
    assert extension.out_of_time(10.0, 1000.0 + margin, 1000.0).startswith("within 10 s, by when")
