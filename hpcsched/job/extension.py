"""Extension allocations, from inside the job: what to add and release for a layout
(:func:`plan_layout`, pure), and rank 0's dealings with Slurm for them (:class:`Extender`).

Slurm facts relied on (``docs/slurm-22.05-notes.md`` §3, and ``docs/slurm-versions.md`` for
24.11 / 26.05): no release grows a running GPU job, so GPUs are added as another job; a running
job's GRES cannot be changed, so the primary's GPUs on a node it keeps cannot be given back
without a requeue, while a whole extension job can end at any time.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcsched import slurm
from hpcsched.protocol.extensions import (
    Extension,
    Extensions,
    ExtensionState,
    extension_comment,
    read_extensions,
    write_extensions,
)
from hpcsched.protocol.files import ProtocolError
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import SlurmState

log = logging.getLogger(__name__)

#: ``sbatch --nice`` of extension jobs: Slurm subtracts it from their priority (sbatch(1); any
#: user may lower their own jobs' priority), so that they come after every other job
EXTENSION_NICE = 1_000_000

#: seconds an extension may take from submission to its workers' readiness before the grow is
#: given up (``HPCSCHED_EXTENSION_TIMEOUT``); Slurm's reason for a pending job is reported
EXTENSION_TIMEOUT = float(os.environ.get("HPCSCHED_EXTENSION_TIMEOUT", "300"))
#: seconds an extension may pend on a node whose free GPUs are fewer than it asks for (another
#: job took them after the grow was planned) before the grow is given up
#: (``HPCSCHED_EXTENSION_BLOCKED``): until a job there ends, the grow's other extensions would
#: hold their GPUs idle, from this job and from everyone else's
EXTENSION_BLOCKED = float(os.environ.get("HPCSCHED_EXTENSION_BLOCKED", "10"))
#: seconds before hpcsched's deadline for an answer (``Control.ack_by``) at which a grow still
#: waiting for its extensions is given up, so that the refusal, with Slurm's reason, is read
#: before the daemon stops waiting: the job's next look at Slurm (every 2 s; the scale
#: stand-in's every 15 s), its acknowledgement, and the daemon's next look at it (a tick, 1 s)
ACK_MARGIN_S = 20.0

#: Slurm job states in which an extension's workers may still come (``squeue --json``)
WAITING = (SlurmState.PENDING, SlurmState.CONFIGURING, SlurmState.RUNNING, SlurmState.REQUEUED, SlurmState.RESIZING)
#: environment variables of the primary that must not leak into an extension's submission
_SLURM_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_")
_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


class LayoutRefused(ValueError):
    """A layout the job cannot reach without a restart (``str`` = why)."""


@dataclass(frozen=True)
class LayoutPlan:
    """How to go from the allocations a job has to a target layout.

    Attributes:
        keep: extension job ids that stay. release: extension job ids whose workers leave
            (their jobs end and give the GPUs back). add: ``{node: GPUs}`` to add, one new
            extension job per node.
    """

    keep: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    add: dict[str, int] = field(default_factory=dict)

    @property
    def changes(self) -> bool:
        return bool(self.release or self.add)


def plan_layout(primary: Mapping[str, int], extensions: list[Extension],
                target: Mapping[str, int]) -> LayoutPlan:
    """Which extension allocations to keep, release and add to run on ``target`` (pure).

    ``primary``: the primary job's GPUs per node; ``extensions``: the active extension
    allocations, oldest first. On each node the primary's GPUs stay; the extensions there are
    kept oldest first while they fit in what the target leaves above the primary, the rest are
    released, and what is still missing is added as one new extension on that node.

    Raises:
        LayoutRefused: the target gives a node fewer GPUs than the primary holds there (Slurm
            cannot release part of a running job's GRES: that needs a requeue).
    """
    short = {n: g for n, g in primary.items() if target.get(n, 0) < g}
    if short:
        raise LayoutRefused(
            "the primary allocation's GPUs cannot be given back in place (" +
            ", ".join(f"{n}: {primary[n]} held, {target.get(n, 0)} asked" for n in short) +
            "); shrink it by whole nodes or requeue")
    keep, release, add = [], [], {}
    for node in dict.fromkeys([*target, *(e.node for e in extensions)]):
        room = target.get(node, 0) - primary.get(node, 0)
        for e in (e for e in extensions if e.node == node):
            if e.gpus <= room:
                keep.append(e.job_id)
                room -= e.gpus
            else:
                release.append(e.job_id)
        if room > 0:
            add[node] = room
    return LayoutPlan(tuple(keep), tuple(release), add)


def extension_env(environ: Mapping[str, str], launch: Mapping[str, str]) -> dict[str, str]:
    """The environment an extension job is submitted with: this worker's, without the
    primary's Slurm, MPI and torch.distributed variables (the extension's own are set by
    Slurm and the worker shim), plus ``launch`` (:class:`hpcsched.protocol.env.LaunchEnv`)."""
    env = {k: v for k, v in environ.items()
           if not k.startswith(_SLURM_PREFIXES) and k not in _TORCH_VARS}
    if "SLURM_CONF" in environ:
        env["SLURM_CONF"] = environ["SLURM_CONF"]
    env.update(launch)
    return env


class Extender:
    """Rank 0's extension allocations: submit, watch, cancel, and ``extensions.json``.

    Args:
        jd: the job directory. spec: the job's spec. primary_job_id: ``SLURM_JOB_ID``.
        environ: this process's environment (partition, account, QoS of the primary).
    """

    def __init__(self, jd: JobDir, spec: JobSpec, primary_job_id: str,
                 environ: Mapping[str, str]):
        self.jd, self.spec, self.primary = jd, spec, primary_job_id
        self.environ = environ
        try:
            found = read_extensions(jd.extensions_path, jd.uid)
        except ProtocolError as exc:
            log.warning("starting a new extensions.json: %s", exc)
            found = None
        self.items: list[Extension] = list(found.extensions) if found else []

    @property
    def active(self) -> list[Extension]:
        return [e for e in self.items if e.state.active]

    def set_state(self, job_id: str, state: ExtensionState, reason: str = "") -> None:
        self.items = [e.to(state, time.time(), reason) if e.job_id == job_id else e
                      for e in self.items]
        self.save()

    def mark_ready(self, job_id: str, at: float) -> None:
        """All of ``job_id``'s workers were ready at ``at`` (Unix seconds)."""
        self.items = [replace(e, ready_at=at) if e.job_id == job_id else e for e in self.items]
        self.save()

    def save(self) -> None:
        done = [e for e in self.items if not e.state.active]
        if len(done) > 64:  # keep the file small: the oldest finished entries go
            drop = {e.job_id for e in done[:-64]}
            self.items = [e for e in self.items if e.job_id not in drop]
        write_extensions(self.jd.extensions_path, Extensions(
            self.jd.uid, self.primary, tuple(self.items), time.time()))

    # ------------------------------------------------------------------ Slurm
    def sbatch_args(self, node: str, gpus: int, generation: int) -> list[str]:
        """sbatch's options for ``gpus`` GPUs on ``node``: the primary's partition, account,
        QoS and remaining time, a recognisable name, the tag, and the lowest priority
        (:data:`EXTENSION_NICE`): lent GPUs never put a job ahead of another in Slurm's queue.
        With a higher priority, a pending extension stops Slurm's main scheduling pass from
        reaching the jobs behind it, which then wait for the backfill pass (up to
        ``bf_interval``, 30 s by default; measured on the dev cluster: a plain job waited
        23 s for its preemption of a lent extension)."""
        env = self.environ
        name = env.get("SLURM_JOB_NAME", "hpcsched")
        out = self.jd.extensions_dir / "slurm-%j.out"
        args = [f"--job-name={name}+ext", f"--comment={extension_comment(self.primary, self.jd.uid, generation)}",
                "--nodes=1", f"--nodelist={node}", f"--ntasks={gpus}",
                f"--ntasks-per-node={gpus}", f"--gres=gpu:{gpus}", f"--output={out}",
                "--no-requeue", f"--nice={EXTENSION_NICE}"]
        for opt, var in (("partition", "SLURM_JOB_PARTITION"), ("account", "SLURM_JOB_ACCOUNT"),
                         ("qos", "SLURM_JOB_QOS")):
            if env.get(var):
                args.append(f"--{opt}={env[var]}")
        left = slurm.time_left(self.primary)
        if left is not None:
            args.append(f"--time={left}")
        if self.spec.submit_dir:
            args.append(f"--chdir={self.spec.submit_dir}")
        return args

    def script(self, node: str, gpus: int, generation: int) -> Path:
        """The extension's batch script: one ``srun`` of the job's workers on its GPUs."""
        d = self.jd.extensions_dir
        d.mkdir(exist_ok=True)
        path = d / f"g{generation}-{node}.sh"
        cmd = ["srun", "--nodes=1", f"--ntasks={gpus}", f"--ntasks-per-node={gpus}",
               self.spec.python, "-m", "hpcsched.worker", self.spec.script, *self.spec.script_args]
        path.write_text("#!/bin/bash\n"
                        f"# hpcsched: extension of job {self.primary} ({self.jd.uid}), "
                        f"generation {generation}\n"
                        f"exec {shlex.join(cmd)}\n")
        path.chmod(0o700)
        return path

    def submit(self, node: str, gpus: int, generation: int, launch: Mapping[str, str]) -> Extension:
        """Submit one extension job; it is recorded as ``submitted``.

        Raises:
            slurm.SlurmError: sbatch refused it (e.g. a limit: its message says which).
            slurm.SlurmUnavailable: the controller did not answer.
        """
        env = extension_env(os.environ, launch)
        job_id = slurm.submit(self.sbatch_args(node, gpus, generation),
                              self.script(node, gpus, generation), env=env)
        now = time.time()
        ext = Extension(job_id, node, gpus, generation, ExtensionState.SUBMITTED, now, now)
        self.items.append(ext)
        self.save()
        log.info("extension job %s submitted: %d GPU(s) on %s for generation %d", job_id, gpus,
                 node, generation)
        return ext

    def cancel(self, job_id: str, state: ExtensionState, reason: str = "") -> None:
        """``scancel`` an extension (errors logged: it may have ended already) and record
        ``state``."""
        try:
            slurm.cancel(job_id)
        except slurm.SlurmError as exc:
            log.info("scancel %s: %s", job_id, exc)
        self.set_state(job_id, state, reason)

    def slurm_states(self) -> dict[str, slurm.JobInfo]:
        """Slurm's view of the active extensions (one ``squeue``); a job Slurm has forgotten
        is absent.

        Raises:
            slurm.SlurmUnavailable, slurm.SlurmError: as :func:`hpcsched.slurm.squeue`.
        """
        jobs = slurm.squeue()
        return {e.job_id: jobs[e.job_id] for e in self.active if e.job_id in jobs}

    def stalled(self, job_ids: Sequence[str], waited: float, ack_by: float = 0.0) -> str | None:
        """Why a grow can wait no longer for its extension jobs ``job_ids`` (submitted
        ``waited`` seconds ago, their workers not all ready), or None. The real job
        (:class:`hpcsched.job.membership.Membership`) and the scale stand-in
        (:mod:`hpcsched.job.standin`) ask this at each of their looks at Slurm: one ``squeue``,
        and one ``sinfo`` only when one of them has pended :data:`EXTENSION_BLOCKED` seconds.

        A grow is given up when one of them ended before its workers joined (Slurm no longer
        lists it, or lists it ended), did not start in time (Slurm's state and reason are
        given: :func:`out_of_time`, :data:`EXTENSION_TIMEOUT` seconds or less, to answer before
        ``ack_by``, the control's deadline), or has pended :data:`EXTENSION_BLOCKED` seconds
        on a node with fewer free GPUs than it asks for (another job took them after the grow
        was planned: until that job ends the grow's other extensions would hold their GPUs
        idle). A Slurm that does not answer is no reason before the timeout: the caller asks
        again at its next look.
        """
        late = out_of_time(waited, ack_by, time.time())
        try:
            states = self.slurm_states()
        except slurm.SlurmError as exc:
            log.warning("cannot look at the extension jobs: %s", exc)
            if late:
                return (f"extension job(s) {', '.join(job_ids)} did not start {late} "
                        f"(Slurm did not answer: {exc})")
            return None
        for job_id in job_ids:
            info = states.get(job_id)
            if info is None or info.state not in WAITING:
                state = info.state if info else "gone"
                return f"extension job {job_id} is {state} before its workers joined"
            if late:
                return (f"extension job {job_id} did not start {late} "
                        f"(Slurm: {info.state}, reason {info.state_reason or 'none'})")
        pending = [j for j in job_ids if states[j].state == SlurmState.PENDING]
        if pending and waited >= EXTENSION_BLOCKED:
            return self._blocked(pending)
        return None

    def _blocked(self, pending: list[str]) -> str | None:
        """Why one of the ``pending`` extension jobs cannot start now: its node has fewer free
        GPUs than it asks for (one ``sinfo``); None when each would fit (Slurm has not started
        it yet, or keeps the GPUs for a job ahead of it: the timeout applies)."""
        try:
            nodes = {n.name: n for n in slurm.nodes()}
        except slurm.SlurmError as exc:
            log.warning("cannot look at the extensions' nodes: %s", exc)
            return None
        for e in self.active:
            node = nodes.get(e.node)
            if e.job_id not in pending or node is None:
                continue
            free = max(0, node.gpus - node.gpus_allocated)
            if free < e.gpus:
                return (f"extension job {e.job_id} cannot start: {e.node} has {free} free GPU(s), "
                        f"it needs {e.gpus} (other jobs hold them; pending over "
                        f"{EXTENSION_BLOCKED:.0f} s)")
        return None


def out_of_time(waited: float, ack_by: float, now: float) -> str:
    """Why a grow whose extensions were submitted ``waited`` seconds ago may wait no longer for
    them at Unix time ``now`` ("within N s", for a message), or "": past
    :data:`EXTENSION_TIMEOUT`, or within :data:`ACK_MARGIN_S` of ``ack_by`` (``Control.ack_by``,
    Unix seconds; 0: none), when hpcsched stops waiting for the job's answer. A job that gives
    up by then answers ``rejected`` with Slurm's reason, where hpcsched would otherwise time
    the generation out without one (``hpcsched.daemon.phases``): in a 1,024-GPU run
    (``benchmarks/daemon_scale.py``) 355 grows ended so, their extension jobs pending for
    ``Priority`` (they come after every other job) past hpcsched's 180 s, within the job's 300."""
    if waited > EXTENSION_TIMEOUT:
        return f"within {EXTENSION_TIMEOUT:.0f} s"
    if ack_by > 0 and now >= ack_by - ACK_MARGIN_S:
        return f"within {waited:.0f} s, by when hpcsched needs the job's answer"
    return ""


def cancel_all(jd: JobDir) -> list[str]:
    """``scancel`` every extension of the job in ``jd`` that may still hold GPUs (submitted,
    joined, or released and perhaps not yet ended), in one call: the launcher does it when the
    primary's workers end, so that no extension outlives them. Returns their ids; nothing is
    raised (errors are logged: Slurm refuses ids that have ended, which is fine)."""
    try:
        found = read_extensions(jd.extensions_path, jd.uid)
    except ProtocolError as exc:
        log.error("cannot read the extensions to cancel them: %s", exc)
        return []
    ids = [e.job_id for e in found.extensions if e.state.active or
           e.state == ExtensionState.RELEASED] if found else []
    if ids:
        try:
            slurm.cancel(*ids)
        except slurm.SlurmError as exc:
            log.info("scancel %s: %s", " ".join(ids), exc)
        log.info("cancelled extension job(s) %s", ", ".join(ids))
    return ids
