"""How the daemon observes Slurm: one :class:`Observation` per round, through a :class:`Backend`.

Two backends implement the same interface and pass the same contract tests
(``tests/test_backend.py``) where they can run:

* :class:`SlurmCLIBackend`: ``squeue --json`` and ``sinfo --json`` (openapi v0.0.38 on Slurm
  22.05), **2 Slurm commands per observation whatever the number of jobs**, each an
  argument list (never a shell) with a timeout, run side by side. Slurm 22.05's JSON lacks
  backfill's planned nodes: :meth:`Backend.with_planned_nodes` reads them (``squeue -o %Y``),
  one more command, for a caller that needs them.
* :class:`PyslurmBackend`: ``pyslurm.Jobs.load()`` and ``pyslurm.Nodes.load()``, only when
  pyslurm is importable and its major.minor version matches the running Slurm (pyslurm tracks
  Slurm's release: pyslurm 22.5.x for Slurm 22.05). PyPI has no pyslurm 22.5 wheel, so on Debian
  12's Slurm 22.05 the CLI backend is the one that runs (``docs/slurm-22.05-notes.md`` §4).

:func:`make_backend` picks one (``"auto"``: pyslurm when :func:`pyslurm_usable`, else the CLI).

What each command prints and how it is parsed: :mod:`hpcsched.slurm.parse`; GPU counts go through
its one GRES/TRES parser, :func:`~hpcsched.slurm.gres.gpu_count`. Every Slurm call either backend
makes is also counted in :func:`hpcsched.slurm.calls`, the figure a daemon round records.
Units: times are Unix seconds, GPU counts are GPUs per node.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from hpcsched.model.snapshot import NodeView
from hpcsched.protocol.kinds import SlurmState
from hpcsched.slurm.commands import DEFAULT_TIMEOUT, count_call, run
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable, says_unreachable
from hpcsched.slurm.gres import gpu_count
from hpcsched.slurm.hostlist import expand_hostlist
from hpcsched.slurm.parse import (
    SCHEDULED_NODES_ARGS,
    JobInfo,
    comment_text,
    name_list,
    node_state,
    parse_scheduled_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)

__all__ = [
    "Backend", "BackendUnusable", "Observation", "PyslurmBackend", "SlurmCLIBackend",
    "make_backend", "pyslurm_usable", "slurm_version",
]

log = logging.getLogger(__name__)


class BackendUnusable(RuntimeError):
    """``make_backend(prefer="pyslurm")`` was asked for a backend that cannot run here."""


# --------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """The cluster as one round of the daemon sees it.

    Attributes:
        time: Unix seconds, taken just before the first Slurm call of this observation; what
            the observation shows is at least this recent.
        nodes: every node (restricted to the backend's partitions, if it has any), in Slurm's
            order, each once.
        jobs: every job Slurm reports, all states (finished ones too until ``MinJobAge``), by
            job id (a read-only mapping).
        calls: Slurm calls this observation cost (2 for both backends, 1 with ``jobs_only``;
            one more where the planned nodes were read, beside the others or by
            :meth:`Backend.with_planned_nodes`).
    """

    time: float
    nodes: tuple[NodeView, ...]
    jobs: Mapping[str, JobInfo]
    calls: int

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self.nodes if n.name == name), None)


@runtime_checkable
class Backend(Protocol):
    """What the daemon needs from Slurm to observe it.

    ``observe()`` raises :class:`~hpcsched.slurm.SlurmUnavailable` when the controller does
    not answer, and :class:`~hpcsched.slurm.SlurmError` when it answers with an error or with
    output that is not what Slurm documents. ``calls`` is the running total of Slurm calls made
    through this backend (read by ``benchmarks/observe_calls.py``); each of them is also counted
    in the process-wide :func:`hpcsched.slurm.calls`.
    """

    name: str
    calls: int

    def observe(self, jobs_only: bool = False) -> Observation:
        """Every job and, unless ``jobs_only``, every node (``jobs_only``: ``nodes`` is empty;
        one Slurm call, where the jobs are all that is asked, e.g. whether one ended)."""
        ...

    def with_planned_nodes(self, obs: Observation) -> Observation:
        """``obs`` with every pending job's :attr:`JobInfo.scheduled_nodes` known (backfill's
        planned nodes; "" where none), at one Slurm call where ``obs`` lacks them (Slurm 22.05's
        JSON), none where it has them."""
        ...


def _restrict(nodes: tuple[NodeView, ...], partitions: Sequence[str]) -> tuple[NodeView, ...]:
    if not partitions:
        return nodes
    want = set(partitions)
    return tuple(n for n in nodes if want.intersection(n.partitions))


# --------------------------------------------------------------------------------------------
# CLI backend
# --------------------------------------------------------------------------------------------


#: seconds :class:`SlurmCLIBackend` uses an answer of planned nodes for: Slurm's backfill plans
#: once a cycle, ``bf_interval`` (slurm.conf(5): 30 s by default)
PLANS_MAX_AGE = 30.0


class SlurmCLIBackend:
    """Observe Slurm through ``squeue --json`` and ``sinfo --json``: 2 commands per
    :meth:`observe`, whatever the number of jobs, started side by side. Slurm 22.05's JSON has
    no planned nodes for pending jobs: :meth:`with_planned_nodes` reads them with a third
    command (``squeue -o %Y``, :func:`~hpcsched.slurm.parse.parse_scheduled_nodes`).

    Backfill plans once a cycle (``bf_interval``, 30 s by default, slurm.conf(5)), so an answer
    is used for ``plans_max_age`` seconds: a job that pends since has no plan until the next
    read. When the last observation needed the planned nodes and that answer is older by then,
    the next :meth:`observe` reads them beside the other two commands (a third, side by side,
    not after them), and :meth:`with_planned_nodes` uses that answer: on a busy controller each
    answer can take seconds (``docs/daemon.md``, "At scale"). A round that then needs no plan
    (it does not call :meth:`with_planned_nodes`, or no pending job lacks its nodes) has made
    one call for nothing, and the next observation does not make it.

    Slurm 22.05's ``squeue --json`` ignores ``--jobs``/``--states`` and reports every job it
    still holds (:func:`hpcsched.slurm.job_info`), so no filter is passed; ``sinfo --json`` is filtered
    here (``partitions``), not with ``-p``.

    Args:
        timeout: seconds each command may take; past it the command is killed and
            :class:`SlurmUnavailable` is raised. A controller that refuses connections makes
            the clients retry for about ``MessageTimeout`` (slurm.conf(5), default 10 s) before
            they give up, so keep this above that only if you would rather wait.
        partitions: keep only nodes in at least one of these partitions (empty: all nodes).
            Jobs are never filtered.
        env: extra environment for the commands (e.g. ``{"SLURM_CONF": ...}``).
        plans_max_age: seconds an answer of planned nodes is used for (0: read every time).

    Raises:
        ValueError: a timeout that is not positive, or a negative ``plans_max_age``.
    """

    name = "cli"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, partitions: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, plans_max_age: float = PLANS_MAX_AGE):
        if timeout <= 0:
            raise ValueError("timeout must be positive (seconds)")
        if plans_max_age < 0:
            raise ValueError("plans_max_age must be >= 0 (seconds)")
        self.plans_max_age = float(plans_max_age)
        if isinstance(partitions, str):
            partitions = [p for p in partitions.split(",") if p]
        self.timeout = float(timeout)
        self.partitions = tuple(partitions)
        self.env = dict(env) if env else None
        self.calls = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="slurm-observe")
        #: whether the next observe reads the planned nodes beside the jobs and nodes
        self._plans_wanted = False
        #: the observation whose planned nodes were read beside it, and that answer (or why not)
        self._plans: tuple[Observation, str | Exception] | None = None
        #: the latest planned nodes read (job id -> hostlist) and when (its observation's time)
        self._planned: tuple[float, dict[str, str]] | None = None

    def __repr__(self) -> str:
        return f"SlurmCLIBackend(timeout={self.timeout:g}, partitions={list(self.partitions)})"

    def with_planned_nodes(self, obs: Observation) -> Observation:
        read, self._plans = self._plans, None
        if not any(j.scheduled_nodes is None and j.state == SlurmState.PENDING
                   for j in obs.jobs.values()):
            self._plans_wanted = False
            return obs   # 23.02+: the JSON has them
        self._plans_wanted = True
        calls = obs.calls
        if read is not None and read[0] is obs:     # read beside it (counted in its calls)
            if isinstance(read[1], Exception):
                raise read[1]
            self._planned = (obs.time, parse_scheduled_nodes(read[1]))
        elif self._plans_stale(obs.time):
            self._planned = (obs.time, parse_scheduled_nodes(self._run(list(SCHEDULED_NODES_ARGS))))
            calls += 1
        assert self._planned is not None    # read above, or recent enough
        return replace(obs, jobs=MappingProxyType(with_scheduled_nodes(obs.jobs, self._planned[1])),
                       calls=calls)

    def _plans_stale(self, t: float) -> bool:
        """Whether the planned nodes last read are ``plans_max_age`` seconds older than ``t``
        (or none were)."""
        return self._planned is None or t - self._planned[0] >= self.plans_max_age

    def _run(self, args: list[str]) -> str:
        with self._lock:
            self.calls += 1
        return run(args, timeout=self.timeout, env=self.env)

    def observe(self, jobs_only: bool = False) -> Observation:
        t = time.time()
        if jobs_only:   # squeue alone: 1 RPC where squeue + sinfo are 3 (benchmarks/daemon_scale.py)
            jobs = parse_squeue_json(self._run(["squeue", "--json", "--states=all"]))
            return Observation(time=t, nodes=(), jobs=MappingProxyType(jobs), calls=1)
        if self._plans is not None:     # read beside the last observation, and not asked for
            self._plans_wanted = False
        self._plans = None
        futs = [self._pool.submit(self._run, ["squeue", "--json", "--states=all"]),
                self._pool.submit(self._run, ["sinfo", "--json"])]
        if self._plans_wanted and self._plans_stale(t):
            futs.append(self._pool.submit(self._run, list(SCHEDULED_NODES_ARGS)))
        # Wait for all before raising, so no command outlives this call.
        results: list[str | Exception] = []
        for fut in futs:
            try:
                results.append(fut.result())
            except Exception as exc:  # noqa: BLE001 - re-raised below, or by with_planned_nodes
                results.append(exc)
        if errors := [r for r in results[:2] if isinstance(r, Exception)]:
            # An unreachable controller is the more useful thing to report.
            errors.sort(key=lambda e: not isinstance(e, SlurmUnavailable))
            raise errors[0]
        jobs = parse_squeue_json(str(results[0]))
        nodes = _restrict(parse_sinfo_json(str(results[1])), self.partitions)
        obs = Observation(time=t, nodes=nodes, jobs=MappingProxyType(jobs), calls=len(futs))
        if len(results) > 2:
            self._plans = (obs, results[2])
        return obs

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def with_scheduled_nodes(jobs: Mapping[str, JobInfo], planned: Mapping[str, str]
                         ) -> dict[str, JobInfo]:
    """``jobs`` with each pending job's :attr:`JobInfo.scheduled_nodes` from ``planned``
    (:func:`~hpcsched.slurm.parse.parse_scheduled_nodes`; "" for a job it leaves out)."""
    return {k: replace(j, scheduled_nodes=planned.get(k, "")) if j.state == SlurmState.PENDING
            else j for k, j in jobs.items()}


# --------------------------------------------------------------------------------------------
# pyslurm backend
# --------------------------------------------------------------------------------------------


def slurm_version(timeout: float = 10.0, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(major, minor) of the installed Slurm from ``sinfo --version`` (``slurm-wlm 22.05.8`` ->
    ``(22, 5)``; Slurm's minor is the release month, pyslurm writes it without the 0).

    Raises:
        SlurmError: sinfo is missing or prints no version.
    """
    out = run(["sinfo", "--version"], timeout=timeout, env=dict(env) if env else None)
    m = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", out)
    if not m:
        raise SlurmError(f"sinfo --version: no version in {out.strip()!r:.80}")
    return int(m.group(1)), int(m.group(2))


def _pyslurm_version(mod: Any) -> str:
    v = getattr(mod, "__version__", None)
    if v is None and callable(getattr(mod, "version", None)):
        v = mod.version()
    return str(v or "")


def pyslurm_usable() -> tuple[bool, str]:
    """Whether :class:`PyslurmBackend` can run here, and why (not).

    Usable when ``import pyslurm`` works, it has the new API (``Jobs.load``/``Nodes.load``,
    pyslurm >= 22.5.2), and its major.minor equals the running Slurm's (``sinfo --version``):
    pyslurm 22.5.x for Slurm 22.05.x. Never raises.
    """
    try:
        import pyslurm  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - ImportError, or a libslurm load failure
        return False, (f"pyslurm cannot be imported ({type(exc).__name__}: {exc}); PyPI has no "
                       "pyslurm 22.5 for Slurm 22.05 (docs/slurm-22.05-notes.md §4)")
    pv = _pyslurm_version(pyslurm)
    m = re.match(r"(\d+)\.(\d+)", pv)
    if not m:
        return False, f"pyslurm {pv!r}: cannot read its version"
    try:
        smaj, smin = slurm_version()
    except SlurmError as exc:
        return False, f"pyslurm {pv} is installed but the Slurm version is unknown: {exc}"
    if (int(m.group(1)), int(m.group(2))) != (smaj, smin):
        return False, (f"pyslurm {pv} does not match Slurm {smaj}.{smin:02d} (pyslurm needs the "
                       f"same major.minor, i.e. pyslurm {smaj}.{smin}.x)")
    for cls in ("Jobs", "Nodes"):
        if not callable(getattr(getattr(pyslurm, cls, None), "load", None)):
            return False, f"pyslurm {pv} has no {cls}.load() (the new API needs pyslurm >= 22.5.2)"
    return True, f"pyslurm {pv} matches Slurm {smaj}.{smin:02d}"


def _attr(obj: Any, *names: str, default: Any = None) -> Any:
    """First attribute of ``obj`` among ``names`` that exists and is not None (pyslurm renamed
    several between releases, e.g. ``alloc_gres`` -> ``allocated_gres``)."""
    for n in names:
        try:
            v = getattr(obj, n)
        except AttributeError:
            continue
        if v is not None:
            return v
    return default


def _epoch(value: Any) -> float | None:
    """A pyslurm time as Unix seconds: None when unset (0) or not a number."""
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


class PyslurmBackend:
    """Observe Slurm through pyslurm's new API (pyslurm >= 22.5.2): ``pyslurm.Jobs.load()`` and
    ``pyslurm.Nodes.load()``, mapped onto the same :class:`Observation` as the CLI backend.

    **Not exercised in CI here**: pyslurm 22.5 is not on PyPI and cannot be installed on this
    project's Slurm 22.05 hosts (``docs/slurm-22.05-notes.md`` §4), so this is written from
    pyslurm's documentation and source (pyslurm.github.io/22.5, ``pyslurm/core/job/job.pyx``,
    ``pyslurm/core/node.pyx``), and the contract tests skip it with :func:`pyslurm_usable`'s reason.

    ``calls`` counts 2 per observation (one ``load()`` each), and so does the process-wide
    :func:`hpcsched.slurm.calls` that the daemon's round statistics read; ``Nodes.load()`` sends
    two RPCs itself (nodes and partitions). libslurm has no per-call timeout: a dead controller makes it
    wait ``MessageTimeout`` (slurm.conf(5)) per retry, so ``timeout`` is accepted for interface
    parity and ignored. Known pyslurm < 23.2.3 quirks handled: ``allocated_gres`` may be empty
    (then GPUs in use are summed from running jobs), and a partly used node may read
    ``ALLOCATED`` instead of ``MIXED`` (left as reported).
    """

    name = "pyslurm"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, partitions: Sequence[str] = (),
                 _module: Any = None):
        if _module is None:
            ok, reason = pyslurm_usable()
            if not ok:
                raise BackendUnusable(reason)
            import pyslurm  # type: ignore[import-not-found]
            _module = pyslurm
        if isinstance(partitions, str):
            partitions = [p for p in partitions.split(",") if p]
        self._ps = _module
        self.timeout = float(timeout)
        self.partitions = tuple(partitions)
        self.calls = 0

    def _load(self, what: str, fn: Callable[[], Any]) -> Any:
        self.calls += 1
        count_call()
        try:
            return fn()
        except Exception as exc:  # pyslurm.RPCError and friends
            msg = f"pyslurm {what}: {exc}"
            if says_unreachable(exc) or "communication" in str(exc).lower():
                raise SlurmUnavailable(msg) from exc
            raise SlurmError(msg) from exc

    @staticmethod
    def _values(coll: Any) -> list:
        # pyslurm 22.5: a dict by id/name; >= 23.2.2 a MultiClusterMap whose values() spans clusters
        return list(coll.values()) if hasattr(coll, "values") else list(coll)

    def with_planned_nodes(self, obs: Observation) -> Observation:
        return obs   # pyslurm's jobs carry them (``scheduled_nodes``/``sched_nodes``)

    def observe(self, jobs_only: bool = False) -> Observation:
        t = time.time()
        jobs_raw = self._load("Jobs.load()", self._ps.Jobs.load)
        nodes_raw = None if jobs_only else self._load("Nodes.load()", self._ps.Nodes.load)
        try:
            jobs = {j.job_id: j for j in map(self._job, self._values(jobs_raw))}
            if nodes_raw is None:
                return Observation(time=t, nodes=(), jobs=MappingProxyType(jobs), calls=1)
            nodes = [self._node(n) for n in self._values(nodes_raw)]
        except SlurmError:
            raise
        except Exception as exc:  # attribute surprises between pyslurm versions
            raise SlurmError(f"pyslurm: unexpected data ({type(exc).__name__}: {exc})") from exc
        nodes = self._fill_allocated(nodes, jobs)
        return Observation(time=t, nodes=_restrict(tuple(nodes), self.partitions),
                           jobs=MappingProxyType(jobs), calls=2)

    @staticmethod
    def _job(j: Any) -> JobInfo:
        return JobInfo(
            job_id=str(_attr(j, "id", "job_id")),
            name=str(_attr(j, "name", default="")),
            user=str(_attr(j, "user_name", "user_id", default="")),
            state=str(_attr(j, "state", default="")).upper(),
            state_reason=str(_attr(j, "state_reason", default="")),
            partition=str(_attr(j, "partition", default="")),
            nodes=str(_attr(j, "allocated_nodes", "nodes", default="")),
            node_count=int(_attr(j, "num_nodes", default=0)),
            gpus_per_node=gpu_count(_attr(j, "gres_per_node", default={})),
            restarts=int(_attr(j, "requeue_count", "restart_cnt", default=0)),
            batch_host=str(_attr(j, "batch_host", default="")),
            priority=int(_attr(j, "priority", default=0)),
            comment=comment_text(_attr(j, "comment", default="")),
            admin_comment=str(_attr(j, "admin_comment", default="") or ""),
            account=str(_attr(j, "account", default="") or ""),
            qos=str(_attr(j, "qos", default="") or ""),
            start_time=_epoch(_attr(j, "start_time", default=None)),
            scheduled_nodes=str(_attr(j, "scheduled_nodes", "sched_nodes", default="") or ""),
        )

    @staticmethod
    def _node(n: Any) -> NodeView:
        state = str(_attr(n, "state", default="unknown"))
        parts = _attr(n, "partitions", default=())
        return NodeView(
            name=str(n.name),
            gpus=gpu_count(_attr(n, "configured_gres", "gres", default={})),
            gpus_allocated=gpu_count(_attr(n, "allocated_gres", "alloc_gres", default={})),
            state=node_state(state, None),
            partitions=name_list(list(parts) if not isinstance(parts, str) else parts, "partitions"),
        )

    @staticmethod
    def _fill_allocated(nodes: list[NodeView], jobs: Mapping[str, JobInfo]) -> list[NodeView]:
        """pyslurm < 23.2.3 returns an empty ``allocated_gres``: when every node reads 0, sum the
        GPUs per node of running jobs instead (what ``gres_used`` would say)."""
        if any(n.gpus_allocated for n in nodes):
            return nodes
        used: dict[str, int] = {}
        for j in jobs.values():
            if (j.state in (SlurmState.RUNNING, SlurmState.COMPLETING, SlurmState.SUSPENDED)
                    and j.gpus_per_node and j.nodes):
                for host in expand_hostlist(j.nodes):
                    used[host] = used.get(host, 0) + j.gpus_per_node
        return [NodeView(n.name, n.gpus, min(n.gpus, used.get(n.name, 0)), n.state, n.partitions)
                for n in nodes]


# --------------------------------------------------------------------------------------------
# Choosing one
# --------------------------------------------------------------------------------------------


def make_backend(prefer: str = "auto", **kw: Any) -> Backend:
    """The backend to observe Slurm with.

    Args:
        prefer: ``"auto"`` (pyslurm when :func:`pyslurm_usable`, else the CLI), ``"cli"``, or
            ``"pyslurm"``.
        **kw: passed to the constructor (``timeout`` in seconds, ``partitions``; ``env`` for the
            CLI backend only).

    Raises:
        BackendUnusable: ``prefer="pyslurm"`` and pyslurm cannot be used (the message says why).
        ValueError: unknown ``prefer``.
    """
    prefer = (prefer or "auto").lower()
    if prefer == "cli":
        return SlurmCLIBackend(**kw)
    if prefer not in ("auto", "pyslurm"):
        raise ValueError(f"unknown backend {prefer!r}: use auto, cli or pyslurm")
    ok, reason = pyslurm_usable()
    if ok:
        kw.pop("env", None)
        return PyslurmBackend(**kw)
    if prefer == "pyslurm":
        raise BackendUnusable(f"pyslurm backend unusable: {reason}")
    log.info("using the Slurm CLI backend: %s", reason)
    return SlurmCLIBackend(**kw)

