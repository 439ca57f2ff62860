"""A pending grow whose extension cannot start because another job holds its node's GPUs is
given up once it has pended ``EXTENSION_BLOCKED`` seconds (``hpcsched.job.membership``), so
that its other extensions do not hold their GPUs idle until the timeout. Slurm is faked here
(its answers only); the dev-cluster test is ``tests/test_extensions_slurm.py``'s ``blocked``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcsched import slurm
from hpcsched.job import membership
from hpcsched.job.membership import Membership, Pending
from hpcsched.model.snapshot import NodeView
from hpcsched.protocol.extensions import Extension, ExtensionState
from hpcsched.slurm.parse import JobInfo


def _job(job_id: str, state: str, reason: str = "None") -> JobInfo:
    return JobInfo(job_id=job_id, name="x+ext", user="alice", state=state, state_reason=reason,
                   partition="gpu", nodes="", node_count=1, gpus_per_node=0, restarts=0,
                   batch_host="", priority=1)


def _ext(job_id: str, node: str, gpus: int) -> Extension:
    return Extension(job_id, node, gpus, 1, ExtensionState.SUBMITTED, 0.0, 0.0)


class _Extender:
    def __init__(self, states: dict[str, JobInfo], active: list[Extension]):
        self.states, self.active = states, active

    def slurm_states(self):
        return self.states


def _membership(states, active) -> Membership:
    m = Membership.__new__(Membership)   # only the extender is used by the look at Slurm
    m.extender = _Extender(states, active)
    return m


def _pending(*job_ids: str) -> Pending:
    return Pending(control=SimpleNamespace(generation=1), release=(), submitted=job_ids,
                   newcomers=6, since=100.0)


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
    m = _membership({"11": _job("11", "RUNNING"), "12": _job("12", "PENDING", "Resources")},
                    [_ext("11", "n1", 4), _ext("12", "n4", 3)])
    t = 100.0 + membership.EXTENSION_BLOCKED
    why = m._extensions_failing(_pending("11", "12"), t)
    assert why is not None and why.startswith(
        "extension job 12 cannot start: n4 has 0 free GPU(s), it needs 3"), why
    # before EXTENSION_BLOCKED seconds Slurm may still be starting it: Slurm's nodes not asked
    nodes["calls"] = 0
    assert m._extensions_failing(_pending("11", "12"), t - 1) is None and nodes["calls"] == 0


@pytest.mark.parametrize("n4", [NodeView("n4", 4, 1, "mixed"), NodeView("n4", 4, 0, "idle")])
def test_an_extension_whose_node_has_room_waits_for_slurm(nodes, n4):
    """Room on its node: Slurm has not started it yet, or keeps the GPUs for a job ahead of it;
    the grow waits (EXTENSION_TIMEOUT)."""
    nodes["nodes"] = (n4,)
    m = _membership({"12": _job("12", "PENDING", "Priority")}, [_ext("12", "n4", 3)])
    assert m._extensions_failing(_pending("12"), 100.0 + membership.EXTENSION_BLOCKED + 5) is None
    assert nodes["calls"] == 1


def test_no_pending_extension_asks_slurm_for_no_node(nodes):
    m = _membership({"11": _job("11", "RUNNING")}, [_ext("11", "n1", 4)])
    assert m._extensions_failing(_pending("11"), 100.0 + 60) is None
    assert nodes["calls"] == 0


def test_a_slurm_that_does_not_answer_is_no_reason_to_give_up(monkeypatch):
    def down(timeout=slurm.DEFAULT_TIMEOUT):
        raise slurm.SlurmUnavailable("sinfo: timed out")

    monkeypatch.setattr(slurm, "nodes", down)
    m = _membership({"12": _job("12", "PENDING", "Resources")}, [_ext("12", "n4", 3)])
    assert m._extensions_failing(_pending("12"), 100.0 + membership.EXTENSION_BLOCKED) is None
