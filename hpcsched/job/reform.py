"""Re-forming a running job's process group on a new membership, without restarting a worker:
growing by extension allocations, releasing them, and going on without a lost one.

Every process group of a launch is one **form**: a number (``hpcsched/forms`` in the launch's
TCPStore, hosted by rank 0) and its members in rank order (:class:`Form`, published under
``hpcsched/form/<n>``). A member is a process: ``p<R>`` for rank ``R`` of the primary's launch,
``e<job>.<task>`` for task ``task`` of extension job ``job``. Form 0 is the launch's own group.

**Grow** (a ``reform`` generation ``G`` whose layout adds GPUs; rank 0 drives it):

1. at a step boundary rank 0 plans the layout (:func:`hpcsched.job.extension.plan_layout`) and
   submits one extension job per node; training goes on;
2. each newcomer, once its script has built the model (:meth:`ElasticJob.register`), adds itself
   under ``hpcsched/ready/g<G>`` and waits for ``hpcsched/join/g<G>``;
3. at the first step boundary at which every newcomer is ready, rank 0 publishes the new form,
   and broadcasts it with the step's decision; every rank (old and new) forms its group, rank 0
   sends the training state (model, optimizer, scheduler, data position, RNG) to all
   (``broadcast_object_list``; old ranks drop their copy) and training goes on at the new size.

**Release** (a layout without some extension): the form is published at once; the released
ranks leave (exit 0, so their extension job ends and its GPUs go back) and the others re-form.

**Leave** (Slurm is ending an extension job: preempted, its QOS being preemptible,
``docs/daemon.md``, "Sharing the cluster", or cancelled): its workers get ``SIGTERM`` and the
QOS's ``GraceTime`` (or ``KillWait``) starts; each
sets ``hpcsched/leaving/<job>``; at its next step boundary rank 0 publishes the form without
them, at the generation in force and the batch refitted, and they leave as released ranks do,
so the preemptor starts within a step, and no step is voided. A newcomer that gets ``SIGTERM``
after it added itself under ``hpcsched/ready/g<G>`` (rank 0 may have counted it and published
a form with it, whose other members would wait the fault timeout for it) still joins, then
leaves at the form's first step boundary; one that gets it before leaves at once, and rank 0
gives the grow up when it sees that extension job end. A grow rank 0 gives up is called off
under ``hpcsched/join/g<G>`` (form ``-1``): newcomers waiting for their invitation leave.

**Loss** (a peer gone mid-step: an extension killed without warning, or its node lost): a
collective fails, at once where gloo sees the connection close, or after the fault timeout;
each survivor marks itself alive under ``hpcsched/alive/<form>/``, rank 0 waits until every
member is alive or known gone (Slurm no longer runs its allocation) or the timeout passes,
publishes the survivors as a new form under ``hpcsched/recover/<form>``, and all re-form. The
step in flight is void (:class:`hpcsched.elastic.ElasticJob` does not count it and gives its
samples out again at the new size), so no sample is lost or processed twice.

The same protocol as Amoeba/EDL's (Wu et al., arXiv:1909.11985, §3: new workers prepare in the
background, then join at a step boundary; a leader publishes the membership through a store).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

FORMS = "hpcsched/forms"
PRIMARY = ""   # the allocation name of the primary job's members


def primary_member(rank: int) -> str:
    return f"p{rank}"


def extension_member(job_id: str, task: int) -> str:
    return f"e{job_id}.{task}"


@dataclass(frozen=True)
class Member:
    """One process: ``id`` (module docstring), its node, and its allocation (an extension
    job id; :data:`PRIMARY` for the primary's)."""

    id: str
    node: str
    allocation: str = PRIMARY


@dataclass(frozen=True)
class Form:
    """One process group of the launch, as rank 0 published it.

    Attributes:
        form: its number. generation: the control generation in force in it.
        members: in rank order. newcomers: members that need the training state.
        local_batch_size, accumulation_steps, lr_scale: the batch configuration in it.
    """

    form: int
    generation: int
    members: tuple[Member, ...]
    newcomers: tuple[str, ...] = ()
    local_batch_size: int = 1
    accumulation_steps: int = 1
    lr_scale: float = 1.0

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, member: str) -> int | None:
        return next((i for i, m in enumerate(self.members) if m.id == member), None)

    def layout(self) -> dict[str, int]:
        """``{node: workers}`` in rank order of first appearance."""
        out: dict[str, int] = {}
        for m in self.members:
            out[m.node] = out.get(m.node, 0) + 1
        return out

    def primary_layout(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.members:
            if m.allocation == PRIMARY:
                out[m.node] = out.get(m.node, 0) + 1
        return out

    @property
    def has_extensions(self) -> bool:
        return any(m.allocation != PRIMARY for m in self.members)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: bytes | str) -> Form:
        obj = json.loads(text)
        obj["members"] = tuple(Member(**m) for m in obj["members"])
        obj["newcomers"] = tuple(obj.get("newcomers", ()))
        return cls(**obj)

    def publish(self, store) -> None:
        store.set(f"hpcsched/form/{self.form}", self.to_json())

    @classmethod
    def read(cls, store, form: int) -> Form:
        return cls.from_json(store.get(f"hpcsched/form/{form}"))


def next_form(store) -> int:
    """A new form number (rank 0)."""
    return int(store.add(FORMS, 1))


# ------------------------------------------------------------------------- newcomers
def announce(store, generation: int, member: Member) -> None:
    """A newcomer is ready to join the group of ``generation`` (now: Unix seconds)."""
    i = int(store.add(f"hpcsched/ready/g{generation}", 1)) - 1
    store.set(f"hpcsched/ready/g{generation}/{i}",
              json.dumps({"member": asdict(member), "at": time.time()}))


def ready(store, generation: int) -> int:
    """How many newcomers have announced themselves for ``generation`` (no wait)."""
    return int(store.add(f"hpcsched/ready/g{generation}", 0))


def announced(store, generation: int, count: int) -> list[tuple[Member, float]]:
    """The newcomers of ``generation``, each with the Unix time it announced itself."""
    out = []
    for i in range(count):
        obj = json.loads(store.get(f"hpcsched/ready/g{generation}/{i}"))
        out.append((Member(**obj["member"]), float(obj["at"])))
    return out


def invite(store, generation: int, form: int) -> None:
    """Tell the newcomers of ``generation`` which form to join (rank 0)."""
    store.set(f"hpcsched/join/g{generation}", str(form))


def call_off(store, generation: int) -> None:
    """Tell the newcomers of ``generation`` that its grow was given up (rank 0)."""
    store.set(f"hpcsched/join/g{generation}", "-1")


class GrowCalledOff(RuntimeError):
    """Rank 0 gave up the grow a newcomer was waiting to join (:func:`call_off`)."""


def invitation(store, generation: int) -> Form:
    """The form a newcomer joins (waits for it up to the store's timeout).

    Raises:
        GrowCalledOff: rank 0 gave the grow up (:func:`call_off`).
        RuntimeError: (from the store) no invitation within the store's timeout, or the
            job's store is gone.
    """
    form = int(store.get(f"hpcsched/join/g{generation}"))
    if form < 0:
        raise GrowCalledOff(f"the grow of generation {generation} was given up")
    return Form.read(store, form)


# ------------------------------------------------------------------------- leaving
def announce_leaving(store, allocation: str) -> None:
    """Slurm is ending extension job ``allocation`` (its workers got ``SIGTERM``; the QOS's
    ``GraceTime`` runs): its workers leave at the next step boundary (rank 0 decides)."""
    store.set(f"hpcsched/leaving/{allocation}", str(time.time()))


def leaving(store, form: Form) -> set[str]:
    """The extension allocations of ``form`` whose workers announced they leave (rank 0; one
    store look per extension allocation, no wait)."""
    allocations = {m.allocation for m in form.members if m.allocation != PRIMARY}
    return {a for a in allocations if store.check([f"hpcsched/leaving/{a}"])}


# ------------------------------------------------------------------------------ loss
def mark_alive(store, form: int, member: str) -> None:
    store.set(f"hpcsched/alive/{form}/{member}", "1")


def survivors(store, old: Form, gone, timeout: float, limit: float = 300.0,
              poll: float = 0.2) -> list[Member]:
    """Rank 0, after a failed collective: the members of ``old`` that marked themselves alive.

    A primary member is never counted lost (the primary's workers are one ``srun`` step: if one
    dies, Slurm ends them all), so every one of them is waited for; it marks itself alive once
    its own collective fails, at the latest after the group's timeout. An extension member is
    waited for until it is alive, or ``gone(member)`` says its allocation no longer runs, or
    ``timeout`` seconds have passed.

    Raises:
        RuntimeError: a primary member did not mark itself alive within ``limit`` seconds.
    """
    start = time.monotonic()
    while True:
        alive, primaries, others = _roll_call(store, old, gone)
        elapsed = time.monotonic() - start
        if not primaries and (not others or elapsed > timeout):
            return alive
        if elapsed > limit:
            raise RuntimeError(f"primary worker(s) {', '.join(m.id for m in primaries)} did not "
                               f"come back within {limit:.0f} s")
        time.sleep(poll)


def _roll_call(store, old: Form, gone) -> tuple[list[Member], list[Member], list[Member]]:
    """One look at which members of ``old`` marked themselves alive: ``(alive, primaries,
    others)``, the alive members and, of the rest, the primary members and the extension
    members whose allocation still runs (``gone(member)`` false), each in ``old``'s order."""
    alive = [m for m in old.members
             if store.check([f"hpcsched/alive/{old.form}/{m.id}"])]
    ids = {m.id for m in alive}
    waiting = [m for m in old.members if m.id not in ids]
    primaries = [m for m in waiting if m.allocation == PRIMARY]
    others = [m for m in waiting if m.allocation != PRIMARY and not gone(m)]
    return alive, primaries, others


def publish_recovery(store, old: Form, new: Form) -> None:
    new.publish(store)
    store.set(f"hpcsched/recover/{old.form}", str(new.form))


def recovery(store, old: Form) -> Form:
    """The form the survivors of ``old`` re-form as (waits up to the store's timeout)."""
    return Form.read(store, int(store.get(f"hpcsched/recover/{old.form}")))
