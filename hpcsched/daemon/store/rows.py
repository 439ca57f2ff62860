"""What the store hands out: plain frozen dataclasses, never ORM objects; and the argument
checks its write methods share."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobRow:
    """A job as stored. Sizes in nodes; batch sizes in samples; times in Unix seconds."""

    job_id: str
    job_uid: str
    user: str
    script: str
    workers_per_node: int
    min_nodes: int
    max_nodes: int
    min_batch_size: int
    max_batch_size: int
    max_local_batch_size: int | None
    base_batch_size: int
    lr_scaling: str
    spec_json: str
    state: str
    submit_time: float | None
    first_seen: float
    last_seen: float
    finished_at: float | None
    app_class: str


@dataclass(frozen=True)
class ProfileRow:
    """A job's profile in one configuration, aggregated over all its samples.

    ``step_time`` (s per optimizer step) and ``throughput`` (samples/s) are means weighted by
    each sample's ``steps``; ``steps`` is their total, ``samples`` the number of rows and
    ``time`` the latest sample's time.
    """

    job_id: str
    world_size: int
    nodes: int
    local_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    step_time: float
    throughput: float
    steps: int
    samples: int
    time: float


@dataclass(frozen=True)
class GpuProbeRow:
    """One GPU's probe (the store's ``gpu_probes``; docs/slurm-plugins.md): ``score`` in ``unit``
    (TFLOP/s for ``kind`` ``cuda``, GFLOP/s for ``cpu-stand-in``), over ``seconds``; ``time``
    in Unix seconds; ``gpu_uuid`` None where the node gave none."""

    id: int
    time: float
    node: str
    gpu_index: str
    gpu_uuid: str | None
    model: str
    kind: str
    score: float
    unit: str
    seconds: float
    job_id: str | None

    @property
    def gpu_key(self) -> str:
        """The GPU's identity: its UUID, else ``node:index``."""
        return self.gpu_uuid or f"{self.node}:{self.gpu_index}"


@dataclass(frozen=True)
class RoundRow:
    """A scheduling round: start (Unix s), duration and policy time (s), counts."""

    id: int
    started_at: float
    duration: float | None
    policy: str
    objective: float | None
    jobs: int
    actions: int
    slurm_calls: int
    policy_seconds: float
    error: str | None
    dry_run: bool


@dataclass(frozen=True)
class ActionRow:
    """A journal entry. Sizes in nodes, batch sizes in samples, times in Unix seconds.

    ``phase``: :class:`~hpcsched.daemon.phases.ResizePhase` value; ``history``: ``((phase,
    time), ...)`` oldest first; ``placement``: nodes to start on (empty: Slurm chooses), or
    ``node:gpus`` entries, a GPU-granular change's layout; ``mechanism``: how a GPU-granular
    change is carried out (:class:`hpcsched.policies.realise.Mechanism`'s value; None at node
    granularity).
    """

    id: int
    round_id: int | None
    job_id: str
    kind: str
    generation: int
    from_nodes: int
    to_nodes: int
    from_batch_size: int
    to_batch_size: int
    reason: str
    phase: str
    error: str | None
    created_at: float
    updated_at: float
    restarts_at_plan: int
    placement: tuple[str, ...] = ()
    history: tuple[tuple[str, float], ...] = ()
    mechanism: str | None = None

    @property
    def status(self) -> str:
        """The phase (the name readers of the journal used before phases existed)."""
        return self.phase


def action_row(obj: Any) -> ActionRow:
    """An :class:`ActionRow` from an ORM ``Action`` (history and placement decoded)."""
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(ActionRow)}
    fields["history"] = tuple((str(p), float(t)) for p, t in json.loads(obj.history or "[]"))
    fields["placement"] = tuple(n for n in (obj.placement or "").split(",") if n)
    return ActionRow(**fields)


def to_row(cls: type, obj: Any) -> Any:
    """A row dataclass ``cls`` from an ORM object with the same field names."""
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})


def columns(model: type) -> set[str]:
    """The column names of an ORM model."""
    return {c.key for c in model.__table__.columns}


def check_keys(what: str, given: Iterable[str], allowed: set[str]) -> None:
    """Raise TypeError naming any key of ``given`` not in ``allowed``."""
    extra = sorted(set(given) - allowed)
    if extra:
        raise TypeError(f"{what}: unknown field(s) {', '.join(extra)}; "
                        f"valid: {', '.join(sorted(allowed))}")


def require(what: str, given: dict, required: Iterable[str]) -> None:
    """Raise ValueError naming any of ``required`` missing (or None) in ``given``."""
    missing = [k for k in required if given.get(k) is None]
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(missing)}")


def insert_checked(write: Callable, what: str, model: type, rows: Iterable[dict],
                   required: Iterable[str], prepare: Callable[[dict], dict]) -> int:
    """Insert ``rows`` into ``model``'s table in one write transaction (``write()``: the store's
    session context), each checked first: keys among the table's columns, ``required`` present,
    then ``prepare(row)`` (defaults, conversions, range checks) gives what is stored. Returns
    how many rows.

    Raises:
        ValueError: an unknown or missing key, or what ``prepare`` refuses (nothing is stored).
    """
    from sqlalchemy import insert

    allowed = columns(model) - {"id"}
    batch = []
    for r in rows:
        check_keys(what, r, allowed)
        require(what, r, tuple(required))
        batch.append(prepare(r))
    if batch:
        with write() as s:
            s.execute(insert(model), batch)
    return len(batch)
