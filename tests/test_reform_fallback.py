"""A re-form whose group never forms (a newcomer that never came: its extension job lost, or its
workers killed, before they joined) is a lost peer, not the end of the job: the members present
go on without it (found by the chaos replay: the job failed on the rendezvous timeout)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcsched.job import reform as rf
from hpcsched.job.boundary import Decision
from hpcsched.job.elastic_membership import ElasticMembership
from hpcsched.protocol.kinds import AckState, ControlAction

P0, P1 = rf.Member("p0", "n1"), rf.Member("p1", "n1")
NEW = rf.Member("e0", "n2", allocation="77")


class _Members:
    def __init__(self, me: rf.Member, entering: rf.Form, survivors: rf.Form):
        self.me, self.form = me, None
        self._forms = {entering.form: entering}
        self.survivors, self.asked = survivors, []

    def read_form(self, number):
        return self._forms[number]

    def survivors_form(self, old, rank, refit):
        self.asked.append((old.form, rank, refit is not None))
        return self.survivors

    def refit(self, global_batch_size):
        return lambda world: (8, 1, 1.0)

    def record(self, old, new, why=""):
        pass


class _Job(ElasticMembership):
    """The mixin over the state it reads; entering a group with newcomers times out."""

    def __init__(self, me: rf.Member, rank: int, entering: rf.Form, survivors: rf.Form):
        self._members = _Members(me, entering, survivors)
        self.rank, self.generation, self.global_batch_size = rank, entering.generation, 16
        self.entered, self.acks = [], []
        self._metrics = SimpleNamespace(close=lambda: None)

    def _enter(self, form):
        if form.newcomers:
            raise RuntimeError("wait timeout after 30000ms, keys: /hpcsched/f3//0//cpu//0/2")
        self.entered.append(form.form)
        self._members.form = form

    def _sync_state(self, form):
        raise AssertionError("no state to hand to newcomers that never came")

    def _resync_survivors(self):
        pass

    def _ack(self, state, generation, message=""):
        self.acks.append((state, generation, message))


def _forms():
    entering = rf.Form(3, 5, (P0, P1, NEW), ("e0",), 4, 1, 1.0)
    survivors = rf.Form(4, 5, (P0, P1), (), 8, 1, 1.0)
    return entering, survivors


@pytest.mark.parametrize("me, rank", [(P0, 0), (P1, 1)])
def test_members_present_go_on_without_a_newcomer_that_never_came(me, rank):
    entering, survivors = _forms()
    job = _Job(me, rank, entering, survivors)
    assert job._reform(Decision(5, ControlAction.REFORM, 2, 0, 4, 1, 1.0, 3, form=3)) is True
    assert job._members.asked == [(3, rank, rank == 0)]   # the survivors of the form entered
    assert job.entered == [4]
    if rank == 0:
        assert job.acks == [(AckState.APPLIED, 5, "lost workers: went on with 2 on n1:2")]


def test_a_newcomer_whose_group_never_formed_still_fails():
    entering, survivors = _forms()
    job = _Job(NEW, 2, entering, survivors)
    with pytest.raises(RuntimeError, match="wait timeout"):
        job._reform(Decision(5, ControlAction.REFORM, 2, 0, 4, 1, 1.0, 3, form=3))


class _SurvivorsMissing(_Job):
    """Entering the survivors' form fails once more (a member cancelled meanwhile)."""

    def __init__(self, *a, again: rf.Form):
        super().__init__(*a)
        self._again = again
        self.failed = []

    def _enter(self, form):
        if form.form == 4 and not self.failed:
            self.failed.append(form.form)
            raise RuntimeError("wait timeout after 30000ms, keys: /hpcsched/f4//0//cpu//0/1")
        super()._enter(form)


def test_a_member_lost_while_the_survivors_re_form_is_left_behind_too():
    entering, survivors = _forms()
    again = rf.Form(5, 5, (P0,), (), 16, 1, 1.0)
    job = _SurvivorsMissing(P0, 0, entering, survivors, again=again)
    results = iter([survivors, again])
    job._members.survivors_form = lambda old, rank, refit: (
        job._members.asked.append(old.form) or next(results))
    job._reform(Decision(5, ControlAction.REFORM, 2, 0, 4, 1, 1.0, 3, form=3))
    assert job._members.asked == [3, 4] and job.entered == [5]
    assert job.acks == [(AckState.APPLIED, 5, "lost workers: went on with 1 on n1:1")]
