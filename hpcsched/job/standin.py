"""A light stand-in for a training job, for scale runs of the daemon only
(``benchmarks/daemon_scale.py``): one process per Slurm job, without torch, that speaks the real
protocol (``docs/control-protocol.md``) so that a thousand running jobs fit on a 2-core machine.

What it does, as the launcher and rank 0 of a real job would, through the same code where the
job has it (:mod:`hpcsched.protocol.files`, :func:`hpcsched.job.launcher.effective_config`,
:class:`hpcsched.job.extension.Extender`, :func:`hpcsched.job.allocation.shrink_from_inside`):

* ``launcher.json`` at each phase change; ``ack.json`` ``applied`` for the generation each launch
  starts with; ``progress.json`` every ``PROGRESS_S`` (10 s: a real job's rank 0 writes it every
  2 s, the daemon reads it once a round) and at the end (``total_samples``, gradient noise);
* one metrics line per optimizer step **for every rank** (``metrics/launch-<L>-rank-<R>.jsonl``;
  extension ranks ``launch-<L>-ext-<J>-rank-<T>.jsonl``), at the step time the simulator's
  physics gives the job's application at its GPU count and local batch size
  (:meth:`hpcsched.sim.emulate.Emulation.step_table`, tabulated at packed placements and
  interpolated in the local batch size), written in one go per tick (``TICK_S``) with each
  line's own end-of-step time;
* control generations: ``continue`` (a new batch split at the same world size),
  ``checkpoint-and-shrink`` (checkpoint, ``scontrol update NumNodes`` from inside the job, the
  resize script adopted, ``applied``), ``checkpoint-and-requeue`` (checkpoint, wait for the
  requeue; the rerun resumes from ``progress.json``), ``reform`` (extension jobs submitted with
  the real job's sbatch options, one per node; their stand-ins say they are ready with a file
  ``extensions/ready-<J>``, the group "re-forms" once all are, released extensions are told
  with ``extensions/release-<J>`` and end with status 0; an extension Slurm ends (``SIGTERM``)
  leaves ``extensions/left-<J>``).

What it does not do: train, checkpoint model state, use the network, or react to Slurm's
pre-timeout ``SIGUSR1`` (scale runs have no time limits). Its work is
``standin.json``'s ``total_samples``; it ends with status 0 once they are processed.

``standin.json`` (in the job directory, written by whoever submits the stand-in):
``{"application", "base_batch_size", "grad_sqr", "grad_var", "steps": {"<gpus>":
[[local_bsz, step_s, sync_s], ...]}, "total_samples", "dataset_size"}``.

Usage (a batch script's last line, in place of ``python -m hpcsched.launcher``)::

    python -m hpcsched.job.standin --job-dir DIR                  # the primary job
    python -m hpcsched.job.standin --job-dir DIR --extension      # an extension job
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import random
import shlex
import signal
import sys
import time
from pathlib import Path

from hpcsched import slurm
from hpcsched.job.allocation import shrink_from_inside
from hpcsched.job.extension import Extender, LayoutRefused, cancel_all, out_of_time, plan_layout
from hpcsched.job.launcher import LaunchConfig, effective_config, launch_batch
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import ExtensionState
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import AckState, ControlAction, LauncherPhase

log = logging.getLogger("hpcsched.job.standin")

#: seconds between two wake-ups: metrics lines, control file (read only when its modification
#: time changed), extensions. A thousand stand-ins share two cores: every wake-up counts. Each
#: sleep is drawn within +-25% of it (:func:`_nap`), so that the hundreds Slurm starts in one
#: scheduling pass do not all wake at the same instant, as real jobs do not
TICK_S = 2.0
#: seconds between two progress.json writes (an atomic write with ``fsync``: a real job's rank 0
#: writes it every 2 s, ``docs/control-protocol.md``; the daemon reads it once a round)
PROGRESS_S = 10.0
#: seconds between an extension's looks at its primary's ``launcher.json`` (has it ended?)
PRIMARY_POLL_S = 10.0
#: an extension whose primary has not written ``progress.json`` for this long (every
#: :data:`PROGRESS_S` while it runs) takes it for gone -- killed without a word (``SIGKILL``, a
#: dev cluster torn down) -- and ends, as a real extension's workers do when their group's
#: collectives fail
PRIMARY_STALE_S = 120.0
#: steps written per rank and tick at most; a longer stall is skipped (not back-filled)
MAX_STEPS_PER_TICK = 400
#: seconds between two ``squeue`` checks of pending extensions while a reform waits
EXTENSION_POLL_S = 15.0


class StepPhysics:
    """Step times from ``standin.json``'s table (module docstring)."""

    def __init__(self, table: dict):
        self.steps = {int(g): sorted((float(m), float(s), float(y)) for m, s, y in rows)
                      for g, rows in table["steps"].items()}
        if not self.steps:
            raise ValueError("standin.json: empty step table")
        self.grad_sqr = float(table.get("grad_sqr", 0.0))
        self.grad_var = float(table.get("grad_var", 0.0))

    def step_time(self, gpus: int, local_bsz: float, accum: int) -> tuple[float, float]:
        """``(step, compute)`` seconds of one optimizer step on ``gpus`` GPUs, ``accum``
        micro-batches of ``local_bsz`` samples per GPU: the physics' ``step + (accum - 1)
        (step - sync)``, and that less the last micro-batch's gradient synchronisation (the
        metrics' ``compute_time``); linear in the local batch size between the table's points,
        clamped at its ends; a GPU count the table lacks takes the nearest one's."""
        rows = self.steps.get(gpus) or self.steps[min(self.steps, key=lambda g: abs(g - gpus))]
        i = bisect.bisect_left([r[0] for r in rows], local_bsz)
        if i <= 0 or i >= len(rows):
            _, step, sync = rows[0 if i <= 0 else -1]
        else:
            (m0, s0, y0), (m1, s1, y1) = rows[i - 1], rows[i]
            w = (local_bsz - m0) / (m1 - m0)
            step, sync = s0 + w * (s1 - s0), y0 + w * (y1 - y0)
        total = step + (max(1, accum) - 1) * (step - sync)
        return total, total - sync


class Ranks:
    """Every rank's metrics file and the constant part of its lines, for one configuration."""

    def __init__(self, metrics_dir: Path, launch: int, restart: int, layout: list[tuple[str, int, str]]):
        metrics_dir.mkdir(exist_ok=True)
        self.files, self.tails = [], []
        pid = os.getpid()
        for rank, (node, local, ext) in enumerate(layout):
            name = f"launch-{launch}-ext-{ext}-rank-{local}" if ext else f"launch-{launch}-rank-{rank}"
            self.files.append(open(metrics_dir / f"{name}.jsonl", "a"))  # noqa: SIM115
            device = json.dumps({"node": node, "local_rank": local, "gpu_index": local},
                                separators=(",", ":"))
            self.tails.append(f'"rank":{rank},"pid":{pid},"device":{device}')
        self.head = f'"launch":{launch},"restart":{restart}'

    def write(self, lines_per_rank: list[str]) -> None:
        """Append one step's body (everything but ``t``/rank/device) per rank."""
        for fh, tail in zip(self.files, self.tails):
            fh.write("".join(f'{{"t":{t:.6f},{self.head},{body},{tail}}}\n' for t, body in lines_per_rank))
            fh.flush()

    def close(self) -> None:
        for fh in self.files:
            fh.close()
        self.files = []


def _nap() -> None:
    """Sleep about :data:`TICK_S` seconds (within +-25%)."""
    time.sleep(TICK_S * random.uniform(0.75, 1.25))


def _stop(*_: object) -> None:
    raise SystemExit(143)


class Primary:
    """The primary job's stand-in: its launcher and rank 0 in one process (module docstring)."""

    def __init__(self, jd: JobDir):
        self.jd, self.spec = jd, jd.read_spec()
        env = os.environ
        self.job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
        self.restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        self.nodelist = env.get("SLURM_JOB_NODELIST", "")
        table = json.loads((jd.path / "standin.json").read_text())
        self.physics = StepPhysics(table)
        self.total = int(table["total_samples"])
        self.dataset = max(1, int(table.get("dataset_size") or self.total))
        state = jd.read_launcher_state()
        self.launches = (state.launches if state is not None else 0) + 1
        self.resizes = state.resizes if state is not None else 0
        progress = self._read(ctl.read_progress, jd.progress_path)
        self.samples = progress.samples_processed if progress is not None else 0
        self.step = progress.step if progress is not None else 0
        self.ext = Joined(jd, self.spec, self.job_id)
        self.ranks: Ranks | None = None
        self.control_seen: int | None = None
        self.control_stamp: int | None = None   # control.json's mtime when last read

    def _read(self, reader, path: Path):
        try:
            return reader(path, self.jd.uid)
        except ctl.ProtocolError as exc:
            log.warning("ignoring %s: %s", path.name, exc)
            return None

    # ------------------------------------------------------------ state files
    def _save_state(self, phase: LauncherPhase, **extra: object) -> None:
        cfg = self.cfg
        ctl.write_launcher_state(self.jd.launcher_path, ctl.LauncherState(
            job_uid=self.jd.uid, job_id=self.job_id, phase=phase, launches=self.launches,
            resizes=self.resizes, restarts=self.restart, time=time.time(), nodelist=self.nodelist,
            generation=cfg.generation, nodes=cfg.nodes, world_size=self.world,
            global_batch_size=cfg.batch.global_batch_size, **extra))

    def _ack(self, state: AckState, generation: int, message: str = "", checkpoint: str = "") -> None:
        b = self.cfg.batch
        ctl.write_ack(self.jd.ack_path, ctl.Ack(
            job_uid=self.jd.uid, generation=generation, state=state, world_size=self.world,
            nodes=len(self.layout), global_batch_size=b.global_batch_size,
            local_batch_size=b.local_batch_size, accumulation_steps=b.accumulation_steps,
            step=self.step, time=time.time(), checkpoint=checkpoint, message=message,
            layout=dict(self.layout) if self.ext.members else {}))

    def _progress(self, finished: bool = False) -> None:
        b = self.cfg.batch
        ctl.write_progress(self.jd.progress_path, ctl.Progress(
            job_uid=self.jd.uid, generation=self.cfg.generation, step=self.step,
            epoch=self.samples // self.dataset, samples_processed=self.samples,
            epoch_position=self.samples % self.dataset,
            throughput=b.global_batch_size / self.step_s, world_size=self.world,
            global_batch_size=b.global_batch_size, time=time.time(), finished=finished,
            total_samples=self.total, grad_sqr=self.physics.grad_sqr, grad_var=self.physics.grad_var))
        self.progress_at = time.monotonic()

    def _checkpoint(self) -> str:
        """The stand-in's "checkpoint": its progress, where a rerun resumes."""
        self._progress()
        d = self.jd.path / "checkpoints"
        d.mkdir(exist_ok=True)
        path = d / f"standin-step-{self.step}.json"
        ctl.write_json_atomic(path, {"samples_processed": self.samples, "step": self.step})
        return str(path)

    # ------------------------------------------------------------ configuration
    @property
    def world(self) -> int:
        return sum(self.layout.values())

    def _configure(self, cfg, nodes: list[str]) -> None:
        """Run ``cfg`` on the primary's ``nodes`` plus the joined extensions: new rank files."""
        self.cfg, self.nodes = cfg, nodes
        self.layout: dict[str, int] = {n: cfg.workers_per_node for n in nodes}
        ranks = [(n, i, "") for n in nodes for i in range(cfg.workers_per_node)]
        for job_id, (node, gpus) in self.ext.members.items():
            self.layout[node] = self.layout.get(node, 0) + gpus
            ranks += [(node, i, job_id) for i in range(gpus)]
        if self.ranks is not None:
            self.ranks.close()
        self.ranks = Ranks(self.jd.metrics_dir, self.launches, self.restart, ranks)
        b = cfg.batch
        self.step_s, self.compute_s = self.physics.step_time(self.world, b.local_batch_size,
                                                             b.accumulation_steps)
        self.next_t = time.time() + self.step_s

    def _refit(self, control, nodes: list[str]):
        """The launcher's configuration on ``nodes``, over the joined extensions' GPUs too."""
        cfg = effective_config(self.spec, control, len(nodes))
        world = len(nodes) * cfg.workers_per_node + sum(g for _, g in self.ext.members.values())
        if world != cfg.world_size:   # a reform's world, or extensions that stay
            batch = launch_batch(self.spec.limits, control, world, cfg.batch.global_batch_size)
            cfg = LaunchConfig(cfg.generation, cfg.nodes, cfg.workers_per_node, batch,
                               self.spec.limits.lr_scale(batch.global_batch_size))
        return cfg

    # ------------------------------------------------------------------- run
    def run(self) -> int:
        self.jd.link_job_id(self.job_id)
        control = self._read(ctl.read_control, self.jd.control_path)
        self.control_seen = control.generation if control is not None else 0
        nodes = slurm.expand_hostlist(self.nodelist)
        self._configure(self._refit(control, nodes), nodes)
        self._save_state(LauncherPhase.RUNNING)
        self._ack(AckState.APPLIED, self.cfg.generation)
        self._progress()
        signal.signal(signal.SIGTERM, self._terminated)
        log.info("job %s (%s): launch %d, %d GPU(s), %d of %d samples done", self.job_id,
                 self.jd.uid, self.launches, self.world, self.samples, self.total)
        while self.samples < self.total:
            self._tick(time.time())
            _nap()
        self._progress(finished=True)
        self.ext.release_all("job finished")
        cancel_all(self.jd)   # as the launcher: no extension outlives the job, joined or not
        self._save_state(LauncherPhase.FINISHED, exit_code=0)
        log.info("job %s done: %d samples in %d steps", self.job_id, self.samples, self.step)
        return 0

    def _terminated(self, *_: object) -> None:
        """Slurm ends the job (requeue, cancel): no extension of its may outlive it."""
        if self.ext.members or self.ext.pending is not None:
            cancel_all(self.jd)
        raise SystemExit(143)

    def _tick(self, now: float) -> None:
        self._emit(now)
        if time.monotonic() - self.progress_at >= PROGRESS_S:
            self._progress()
        self._check_control()
        if self.ext.pending is not None:
            self._advance_reform(now)
        if self.ext.members:
            self._check_left()

    def _emit(self, now: float) -> None:
        """Every step that ended by ``now``: one line per rank, samples counted."""
        b, out = self.cfg.batch, []
        head = (f'"generation":{self.cfg.generation},"world_size":{self.world},'
                f'"nodes":{len(self.layout)},"local_batch_size":{b.local_batch_size},'
                f'"accumulation_steps":{b.accumulation_steps},'
                f'"global_batch_size":{b.global_batch_size},"global_samples":{b.global_batch_size},'
                f'"samples":{b.local_batch_size * b.accumulation_steps},'
                f'"consumed":{b.global_batch_size},"step_time":{self.step_s:.6f},'
                f'"compute_time":{self.compute_s:.6f},"grad_sqr":{self.physics.grad_sqr!r},'
                f'"grad_var":{self.physics.grad_var!r}')
        while self.next_t <= now and len(out) < MAX_STEPS_PER_TICK and self.samples < self.total:
            self.step += 1
            out.append((self.next_t, f'"step":{self.step},"epoch":{self.samples // self.dataset},'
                                     f'"position":{self.samples % self.dataset},{head}'))
            self.samples += b.global_batch_size
            self.next_t += self.step_s
        if self.next_t <= now:   # a stall (or a step faster than the cap): skipped, not back-filled
            self.next_t = now + self.step_s
        if out and self.ranks is not None:
            self.ranks.write(out)

    # ------------------------------------------------------------ control
    def _check_control(self) -> None:
        try:
            stamp = os.stat(self.jd.control_path).st_mtime_ns
        except OSError:
            return
        if stamp == self.control_stamp:
            return
        self.control_stamp = stamp
        control = self._read(ctl.read_control, self.jd.control_path)
        if control is None or control.generation <= (self.control_seen or 0):
            return
        self.control_seen = control.generation
        log.info("generation %d: %s to %d node(s), global batch %d", control.generation,
                 control.action, control.nodes, control.global_batch_size)
        if self.ext.pending is not None:   # superseded while extensions were coming
            self._give_up_reform(f"superseded by generation {control.generation}")
        if control.action == ControlAction.CONTINUE:
            self._continue(control)
        elif control.action == ControlAction.CHECKPOINT_AND_SHRINK:
            self._shrink(control)
        elif control.action == ControlAction.CHECKPOINT_AND_REQUEUE:
            self._await_requeue(control)
        elif control.action == ControlAction.REFORM:
            self._start_reform(control)

    def _continue(self, control) -> None:
        if control.world_size != self.world:
            self._ack(AckState.REJECTED, control.generation,
                      f"continue at world size {control.world_size}, the job runs {self.world}")
            return
        self._configure(self._refit(control, self.nodes), self.nodes)
        self._ack(AckState.APPLIED, control.generation)

    def _shrink(self, control) -> None:
        """In place: checkpoint, release nodes from inside the job, adopt Slurm's resize script."""
        self._ack(AckState.CHECKPOINTED, control.generation, checkpoint=self._checkpoint())
        nodes = self.nodes
        if control.nodes < len(self.nodes):
            self._save_state(LauncherPhase.RESIZING, target_nodes=control.nodes)
            script = self.jd.path / f"slurm_job_{self.job_id}_resize.sh"
            script.unlink(missing_ok=True)
            if shrink_from_inside(self.job_id, control.nodes, self.jd.path) is None and script.exists():
                setv, _ = slurm.parse_resize_script(script.read_text())
                self.nodelist = setv.get("SLURM_JOB_NODELIST", self.nodelist)
                nodes = slurm.expand_hostlist(self.nodelist)
                self.resizes += 1
        self._configure(self._refit(control, nodes), nodes)
        self._save_state(LauncherPhase.RUNNING)
        self._ack(AckState.APPLIED, control.generation)

    def _await_requeue(self, control) -> None:
        """Checkpoint and wait to be requeued (Slurm's SIGTERM ends this process); resume on the
        allocation it has if no requeue comes (``HPCSCHED_REQUEUE_TIMEOUT``, as the launcher)."""
        self._ack(AckState.CHECKPOINTED, control.generation, checkpoint=self._checkpoint())
        self._save_state(LauncherPhase.AWAITING_REQUEUE, target_nodes=control.nodes)
        time.sleep(float(os.environ.get("HPCSCHED_REQUEUE_TIMEOUT", "300")))
        log.warning("no requeue came; resuming on the current allocation")
        self.launches += 1
        self._configure(self._refit(control, self.nodes), self.nodes)
        self._save_state(LauncherPhase.RUNNING)
        self._ack(AckState.APPLIED, control.generation)

    # ------------------------------------------------------------ extensions
    def _start_reform(self, control) -> None:
        primary = {n: self.cfg.workers_per_node for n in self.nodes}
        refused = self.ext.start(control, primary)
        if refused:
            self._ack(AckState.REJECTED, control.generation, refused)
        else:
            self._advance_reform(time.time())

    def _advance_reform(self, now: float) -> None:
        control, outcome = self.ext.advance(now)
        if outcome is None:
            return
        if outcome:
            self._ack(AckState.REJECTED, control.generation, outcome)
            return
        self._configure(self._refit(control, self.nodes), self.nodes)
        self._ack(AckState.APPLIED, control.generation, "re-formed on the layout")

    def _give_up_reform(self, why: str) -> None:
        control = self.ext.give_up(why)
        self._ack(AckState.REJECTED, control.generation, why)

    def _check_left(self) -> None:
        """Extensions Slurm ended (preempted, cancelled): the group goes on without them."""
        where = self.ext.left()
        if not where:
            return
        control = self._read(ctl.read_control, self.jd.control_path) if self.cfg.generation else None
        self._configure(self._refit(control, self.nodes), self.nodes)
        self._ack(AckState.APPLIED, self.cfg.generation,
                  f"extension workers left (Slurm ended their job: SIGTERM): {where}")


class Joined:
    """The stand-in's extension allocations: the reform waiting for newcomers, the extensions
    in the group, their release (``extensions/release-<J>``) and their leave
    (``extensions/left-<J>``); ``extensions.json`` through the real job's
    :class:`~hpcsched.job.extension.Extender`."""

    def __init__(self, jd: JobDir, spec, primary_job_id: str):
        self.jd, self.spec, self.primary_job_id = jd, spec, primary_job_id
        self._extender: Extender | None = None
        self.members: dict[str, tuple[str, int]] = {}     # extension job id -> (node, GPUs)
        self.pending: tuple | None = None                 # (control, plan, since, last poll)

    @property
    def extender(self) -> Extender:
        if self._extender is None:
            self._extender = StandinExtender(self.jd, self.spec, self.primary_job_id, dict(os.environ))
        return self._extender

    def start(self, control, primary: dict[str, int]) -> str:
        """Plan ``control``'s layout and submit what is missing; the refusal, or ""."""
        ext = self.extender
        try:
            plan = plan_layout(primary, ext.active, control.layout)
        except LayoutRefused as exc:
            return str(exc)
        submitted = []
        try:
            for node, gpus in plan.add.items():
                submitted.append(ext.submit(node, gpus, control.generation, {}).job_id)
        except slurm.SlurmError as exc:
            for job_id in submitted:
                ext.cancel(job_id, ExtensionState.REFUSED, str(exc))
            return f"extension refused by Slurm: {exc}"
        self.pending = (control, plan, time.time(), time.time())
        return ""

    def advance(self, now: float) -> tuple:
        """``(control, None)`` while newcomers are awaited, ``(control, "")`` once the group
        re-formed with them, ``(control, why)`` when the reform was given up."""
        control, plan, since, polled = self.pending
        ext = self.extender
        new = [e for e in ext.active if e.generation == control.generation and e.job_id not in self.members]
        waiting = [e for e in new if not (self.jd.extensions_dir / f"ready-{e.job_id}").exists()]
        if waiting:
            why = self._stalled([e.job_id for e in waiting], now)
            if why:
                self.give_up(why)
            return control, (why or None)
        for job_id in plan.release:
            self.release(job_id, "released by the layout")
        for e in new:
            ext.mark_ready(e.job_id, now)
            ext.set_state(e.job_id, ExtensionState.JOINED)
            self.members[e.job_id] = (e.node, e.gpus)
        self.pending = None
        return control, ""

    def _stalled(self, waiting: list[str], now: float) -> str:
        """Why the reform cannot wait longer for the extension jobs ``waiting``, or "": the
        real job's rule (:meth:`hpcsched.job.extension.Extender.stalled`: ended, not started
        in time, or pending on a node others hold), asked every ``EXTENSION_POLL_S``, and at
        once when the control's deadline has come within its margin since the last look
        (:func:`hpcsched.job.extension.out_of_time`): a look due up to 15 s later answered
        after the daemon had stopped waiting (18 grows in a 1,024-GPU run)."""
        control, plan, since, polled = self.pending
        due = out_of_time(now - since, control.ack_by, now) and not out_of_time(
            polled - since, control.ack_by, polled)
        if now - polled <= EXTENSION_POLL_S and not due:
            return ""
        self.pending = (control, plan, since, now)
        return self.extender.stalled(waiting, now - since, control.ack_by) or ""

    def give_up(self, why: str):
        """Cancel the pending reform's newcomers; returns its control."""
        control, *_ = self.pending
        for e in self.extender.active:
            if e.generation == control.generation and e.job_id not in self.members:
                self.extender.cancel(e.job_id, ExtensionState.REFUSED, why)
        self.pending = None
        return control

    def release(self, job_id: str, why: str) -> None:
        (self.jd.extensions_dir / f"release-{job_id}").touch()
        self.extender.set_state(job_id, ExtensionState.RELEASED, why)
        self.members.pop(job_id, None)

    def release_all(self, why: str) -> None:
        for job_id in list(self.members):
            self.release(job_id, why)

    def left(self) -> str:
        """Members whose job Slurm ended, dropped; ``node:GPUs`` of each, or ""."""
        gone = [j for j in self.members if (self.jd.extensions_dir / f"left-{j}").exists()]
        where = ",".join(f"{self.members[j][0]}:{self.members[j][1]}" for j in gone)
        for job_id in gone:
            self.extender.set_state(job_id, ExtensionState.RELEASED,
                                    "Slurm ended it (SIGTERM: preempted or cancelled)")
            self.members.pop(job_id)
        return where


class StandinExtender(Extender):
    """The real job's extension submission (:class:`~hpcsched.job.extension.Extender`: its
    sbatch options, tag and ``extensions.json``), with the stand-in as the extension's work."""

    def script(self, node: str, gpus: int, generation: int) -> Path:
        d = self.jd.extensions_dir
        d.mkdir(exist_ok=True)
        path = d / f"g{generation}-{node}.sh"
        path.write_text("#!/bin/bash\n"
                        f"# hpcsched stand-in: extension of job {self.primary}, generation {generation}\n"
                        f"exec {shlex.quote(sys.executable)} -m hpcsched.job.standin --extension "
                        f"--job-dir {shlex.quote(str(self.jd.path))}\n")
        path.chmod(0o700)
        return path


class Extension:
    """An extension job's stand-in: ready at once, gone when released or when Slurm ends it."""

    def __init__(self, jd: JobDir):
        self.jd = jd
        self.job_id = os.environ.get("SLURM_JOB_ID") or "0"

    def run(self) -> int:
        d = self.jd.extensions_dir
        signal.signal(signal.SIGTERM, self._terminated)
        (d / f"ready-{self.job_id}").touch()
        looked = time.monotonic()
        while not (d / f"release-{self.job_id}").exists():
            if time.monotonic() - looked >= PRIMARY_POLL_S:
                looked = time.monotonic()
                why = self.primary_gone(time.time())
                if why:
                    log.info("extension %s ends: %s", self.job_id, why)
                    break
            _nap()
        return 0

    def primary_gone(self, now: float) -> str:
        """Why the primary is gone, or "": its launcher says it ended, its job directory is
        gone, or its ``progress.json`` is over :data:`PRIMARY_STALE_S` old (Unix s ``now``)."""
        if not self.jd.path.is_dir():
            return f"the job directory {self.jd.path} is gone"
        state = self.jd.read_launcher_state()
        if state is not None and state.phase in (LauncherPhase.FINISHED, LauncherPhase.FAILED):
            return f"the primary job {state.phase.value}"
        try:
            age = now - self.jd.progress_path.stat().st_mtime
        except FileNotFoundError:
            return ""
        if age > PRIMARY_STALE_S:
            return f"the primary wrote no progress for {age:.0f} s"
        return ""

    def _terminated(self, *_: object) -> None:
        (self.jd.extensions_dir / f"left-{self.job_id}").touch()
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """``python -m hpcsched.job.standin --job-dir DIR [--extension]``; exit status 0 when the
    work is done (or, for an extension, when released)."""
    p = argparse.ArgumentParser(prog="python -m hpcsched.job.standin",
                                description=__doc__.split("\n")[0])
    p.add_argument("--job-dir", required=True, type=Path)
    p.add_argument("--extension", action="store_true", help="run as one of the job's extension jobs")
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("HPCSCHED_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s standin %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    jd = JobDir(args.job_dir)
    return Extension(jd).run() if args.extension else Primary(jd).run()


if __name__ == "__main__":
    sys.exit(main())
