"""The launcher: the batch step of every hpcsched job.

It starts one worker per GPU slot with ``srun`` across the allocation, and after the workers
stop it looks at the acknowledgement they left (see :mod:`hpcsched.protocol.files`):

* training ended (no pending resize) -> exit with srun's status; workers killed by a signal
  (status above 128: a lost node) -> launch again from the newest checkpoint, at most
  :data:`LOST_RELAUNCHES` times in a row without a newer one;
* ``checkpointed`` for a ``checkpoint-and-shrink`` -> ``scontrol update
  JobId=$SLURM_JOB_ID NumNodes=<n>`` **from inside the job** (only then does Slurm write
  ``slurm_job_<id>_resize.sh`` with the new environment;
  :func:`hpcsched.job.allocation.shrink_from_inside`), apply that environment, relaunch the
  workers on the remaining nodes with explicit ``-N``/``-n``. If Slurm refuses the update, the
  workers are relaunched on the allocation the job still has;
* ``checkpointed`` for a ``checkpoint-and-requeue`` -> wait for hpcsched to requeue the job
  (Slurm then kills this step and reruns the batch script at the new size); if no requeue comes
  within ``--requeue-timeout`` seconds, resume at the current size so the job never idles;
* ``stopped``: the workers checkpointed on Slurm's ``SIGUSR1`` (hpcsub asks for it
  :data:`~hpcsched.job.submit.PRE_TIMEOUT_S` seconds before the time limit) -> ``scontrol
  requeue`` the job itself, so it reruns from that checkpoint instead of being killed at its
  limit (a requeued job waits 121 s to start, ``docs/slurm-22.05-notes.md`` §3, unless the
  daemon releases it at once). Where Slurm refuses (``--no-requeue``), relaunch from the
  checkpoint and train on until the limit.

Slurm behaviour relied on (measured on 22.05, ``docs/slurm-22.05-notes.md`` §3): a shrink
SIGKILLs tasks on released nodes (hence checkpoint first); the batch environment is stale after
a resize unless the resize script is sourced; a plain ``srun`` afterwards fails, so ``-N``/``-n``
are always explicit.

Extension allocations (``docs/extensions.md``) are the workers' business (rank 0 submits and
releases them); the launcher cancels every one that may still run whenever its own workers
end (:func:`hpcsched.job.extension.cancel_all`), so none outlives the job.

The launcher tells the workers what to run with through their environment
(:class:`hpcsched.protocol.env.LaunchEnv`) and tells hpcsched what it is doing in
``launcher.json`` (:class:`hpcsched.protocol.files.LauncherState`).

Usage (from the batch script hpcsub renders): ``python -m hpcsched.launcher --job-dir DIR``
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcsched import slurm
from hpcsched.job.allocation import shrink_from_inside
from hpcsched.job.extension import cancel_all
from hpcsched.job.submit import PRE_TIMEOUT_S
from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig, BatchSizeError
from hpcsched.protocol.env import LaunchEnv
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import AckState, ControlAction, LauncherPhase
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.parse import duration_seconds

log = logging.getLogger("hpcsched.job.launcher")

#: seconds the launcher waits for an unreachable slurmctld before giving up (a restart of the
#: controller takes seconds; SlurmctldTimeout defaults to 120 s, man slurm.conf)
SLURMCTLD_WAIT_S = 180.0


def _while_unreachable(call, what: str, wait: float = SLURMCTLD_WAIT_S, poll: float = 2.0):
    """``call()``, again every ``poll`` s while Slurm's controller cannot be reached, up to
    ``wait`` s: a controller restarted under a running job must not fail the job.

    Raises:
        SlurmUnavailable: still unreachable after ``wait`` s. SlurmError: any other error.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            return call()
        except slurm.SlurmUnavailable as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("%s: Slurm's controller unreachable (%s); trying again", what, exc)
            time.sleep(poll)


@dataclass(frozen=True)
class LaunchConfig:
    """What one launch of the workers runs with."""

    generation: int
    nodes: int
    workers_per_node: int
    batch: BatchConfig
    lr_scale: float

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node


def effective_config(spec: JobSpec, control: ctl.Control | None, nodes: int) -> LaunchConfig:
    """The configuration to launch with on ``nodes`` nodes (pure).

    The newest control generation wins; when its world size matches the allocation its batch
    configuration is used as is, otherwise (Slurm gave a different number of nodes, or the job
    starts for the first time) its global batch size is refitted to the real world size within
    the job's limits (:func:`hpcsched.protocol.batching.fit_batch`). A generation that
    requeued the job onto a layout of ``k`` GPUs per node (``k`` other than the submitted)
    runs ``k`` workers per node.

    Raises:
        BatchSizeError: no batch configuration fits the limits at this world size.
    """
    limits = spec.limits
    wpn = limits.workers_per_node
    if control is not None and control.layout and control.action != ControlAction.REFORM \
            and control.nodes == nodes:   # requeued onto another number of GPUs per node
        wpn = control.workers_per_node
    world = nodes * wpn
    generation = control.generation if control is not None else 0
    batch = launch_batch(limits, control, world, limits.base_batch_size)
    return LaunchConfig(generation, nodes, wpn, batch, limits.lr_scale(batch.global_batch_size))


def launch_batch(limits: JobLimits, control: ctl.Control | None, world: int,
                 default: int) -> BatchConfig:
    """The batch configuration at ``world`` workers (pure): ``control``'s own when its world
    size is ``world``, else its global batch size (``default`` without a control) refitted to
    ``world`` within ``limits`` (:meth:`~hpcsched.protocol.limits.JobLimits.fit_batch_gpus`).

    Raises:
        BatchSizeError: no batch configuration fits the limits at this world size.
    """
    if control is not None and control.world_size == world:
        return BatchConfig(world, control.local_batch_size, control.accumulation_steps)
    target = control.global_batch_size if control is not None else default
    return limits.fit_batch_gpus(target, world)


#: launches in a row whose workers were killed (no newer checkpoint between them) after which
#: the launcher gives up (:meth:`Launcher._relaunch_after_loss`)
LOST_RELAUNCHES = 3

#: the first port :func:`master_port` hands out
PORT_BASE = 20000


def port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """``[first, end)`` of the ports :func:`master_port` hands out: from 20000 up to the
    kernel's ephemeral range (``ip_local_port_range``, ip-sysctl(7)), whose ports any outgoing
    connection on the node may hold at any moment; 20000-49999 where that range leaves fewer
    than 1024 ports below it or cannot be read."""
    try:
        low = int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    return (PORT_BASE, low) if low - PORT_BASE >= 1024 else (PORT_BASE, 50000)


def port_is_free(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on every address of this host now (as
    ``torch.distributed.TCPStore`` does: ``SO_REUSEADDR``, so a port in TIME_WAIT counts as
    free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def master_port(job_id: str, launch: int, free: Callable[[int], bool] | None = None,
                ports: tuple[int, int] | None = None) -> int:
    """A TCP port for rank 0's store, different for every launch of a job.

    The first candidate is ``first + (job_id * 7919 + launch * 104729) mod (end - first)`` in
    ``ports`` (default :func:`port_range`); where ``free`` is given (:func:`port_is_free` when
    the launcher runs on rank 0's node), the next candidates (steps of 7) are tried until one
    is free, up to 64, so another job's store or an outgoing connection does not make rank 0
    fail with EADDRINUSE."""
    first, end = ports or port_range()
    start = int(job_id) * 7919 + launch * 104729
    candidates = [first + (start + 7 * i) % (end - first) for i in range(64)]
    if free is not None:
        for port in candidates:
            if free(port):
                return port
    return candidates[0]


class Launcher:
    def __init__(self, job_dir: Path, requeue_timeout: float = 300.0):
        self.jd = JobDir(job_dir)
        self.spec = self.jd.read_spec()
        self.job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or "0"
        self.env = dict(os.environ)
        self.requeue_timeout = requeue_timeout
        state = self.jd.read_launcher_state()  # from the runs before a requeue
        self.launches = state.launches if state is not None else 0
        self.resizes = state.resizes if state is not None else 0
        self._lost, self._lost_at = 0, None   # killed launches in a row, at which checkpoint

    # -------------------------------------------------------------- helpers
    def _save_state(self, phase: LauncherPhase, cfg: LaunchConfig | None = None,
                    **extra) -> None:
        """Write ``launcher.json``; ``extra``: ``target_nodes``, ``exit_code`` or ``error``."""
        config = {}
        if cfg is not None:
            config = {"generation": cfg.generation, "nodes": cfg.nodes,
                      "world_size": cfg.world_size,
                      "global_batch_size": cfg.batch.global_batch_size}
        ctl.write_launcher_state(self.jd.launcher_path, ctl.LauncherState(
            job_uid=self.jd.uid, job_id=self.job_id, phase=phase, launches=self.launches,
            resizes=self.resizes, restarts=int(self.env.get("SLURM_RESTART_COUNT", "0") or 0),
            time=time.time(), nodelist=self.env.get("SLURM_JOB_NODELIST", ""), **config,
            **extra))

    def _read_control(self) -> ctl.Control | None:
        try:
            return ctl.read_control(self.jd.control_path, self.jd.uid)
        except ctl.ProtocolError as exc:
            log.error("ignoring control file: %s", exc)
            return None

    def _read_ack(self) -> ctl.Ack | None:
        try:
            return ctl.read_ack(self.jd.ack_path, self.jd.uid)
        except ctl.ProtocolError as exc:
            log.error("unreadable acknowledgement: %s", exc)
            return None

    def _nodes(self) -> list[str]:
        return slurm.hostnames(self.env.get("SLURM_JOB_NODELIST", ""))

    # ------------------------------------------------------------------ run
    def _forget_resize_scripts(self) -> None:
        for suffix in ("sh", "csh"):
            (self.jd.path / f"slurm_job_{self.job_id}_resize.{suffix}").unlink(missing_ok=True)

    def run(self) -> int:
        """Run the job's workers until it is done: launch them at the configuration in force,
        and after they exit carry out the request they checkpointed for (:meth:`_follow`) and
        launch again, or requeue the job when they stopped for it; the workers' exit status
        (1 when no configuration fits the nodes)."""
        self.jd.link_job_id(self.job_id)
        self._forget_resize_scripts()  # left by an earlier run of this job: stale after a requeue
        restarts = self.env.get("SLURM_RESTART_COUNT", "0")
        log.info("job %s (%s) starting: restart %s, nodes %s", self.job_id, self.jd.uid,
                 restarts, self.env.get("SLURM_JOB_NODELIST"))
        while True:
            self._adopt_resize_script()
            nodes = self._nodes()
            control = self._read_control()
            try:
                cfg = effective_config(self.spec, control, len(nodes))
            except BatchSizeError as exc:
                log.error("cannot run on %d node(s): %s", len(nodes), exc)
                self._save_state(LauncherPhase.FAILED, error=str(exc))
                return 1
            launched_at = time.time()
            rc = self._launch(cfg, nodes)
            ack = self._read_ack()
            if ack is not None and ack.state == AckState.STOPPED and ack.time >= launched_at:
                self._requeue_self(cfg, ack)
                continue
            pending = self._checkpointed_request(ack, cfg)
            if pending is None and self._relaunch_after_loss(rc):
                continue
            if pending is None:
                self._save_state(LauncherPhase.FINISHED if rc == 0 else LauncherPhase.FAILED, cfg,
                                 exit_code=rc)
                log.info("workers exited with status %d; job done", rc)
                return rc
            self._follow(pending, cfg, len(nodes))

    def _relaunch_after_loss(self, rc: int) -> bool:
        """Whether to launch again after workers that did not end on their own: srun's status
        above 128 is a task killed by signal ``rc - 128`` (``SIGKILL``: a lost node, an
        out-of-memory kill). They are launched again on the allocation the job holds, resuming
        from its newest checkpoint, so a lost node costs at most one checkpoint interval of
        training; at most :data:`LOST_RELAUNCHES` times in a row with no newer checkpoint (a
        script that is killed every time ends, with that status)."""
        if rc <= 128:
            return False
        from hpcsched.job.checkpoint import Checkpointer

        latest = Checkpointer.for_job(self.spec.checkpoint_dir, self.jd.path, 0.0).latest_path()
        source = latest.name if latest else "the start (no checkpoint yet)"
        same = self._lost_at == latest
        self._lost_at, self._lost = latest, (self._lost + 1 if same else 1)
        if self._lost > LOST_RELAUNCHES:
            log.error("workers killed (status %d) %d times in a row with no newer checkpoint: "
                      "giving up", rc, self._lost)
            return False
        if self._near_time_limit():
            # Slurm's pre-timeout signal goes to the workers' step once: one that comes
            # between two launches is lost, and the job would be killed at its limit
            log.warning("workers killed (status %d) within %d s of the time limit: requeueing "
                        "job %s to resume from %s", rc, PRE_TIMEOUT_S, self.job_id, source)
            self._requeue_now(None)
            return True
        log.warning("workers killed (status %d: a lost node or an out-of-memory kill); "
                    "launching again from %s (%d of %d with no newer checkpoint)", rc, source,
                    self._lost, LOST_RELAUNCHES)
        return True

    def _checkpointed_request(self, ack: ctl.Ack | None, cfg: LaunchConfig) -> ctl.Control | None:
        """After the workers of generation ``cfg.generation`` exited: the control request
        they checkpointed for (its generation newer than ``cfg``'s and the one ``ack``, their
        acknowledgement, checkpointed for), or ``None`` when they exited for good (finished,
        failed, or without such a checkpoint)."""
        if ack is not None and ack.state == AckState.CHECKPOINTED:
            log.info("workers exited %.2f s after the checkpoint for generation %d",
                     time.time() - ack.time, ack.generation)
        pending = self._read_control()
        if not (ack and ack.state == AckState.CHECKPOINTED and ack.generation > cfg.generation
                and pending is not None and pending.generation == ack.generation):
            return None
        return pending

    def _follow(self, pending: ctl.Control, cfg: LaunchConfig, n_nodes: int) -> None:
        """Carry out the checkpointed request ``pending`` before the next launch, on a job
        running ``cfg`` over ``n_nodes`` nodes: a shrink to fewer nodes gives the rest back, a
        requeue waits to be requeued, anything else relaunches on the same nodes."""
        if pending.action == ControlAction.CHECKPOINT_AND_SHRINK and pending.nodes < n_nodes:
            self._shrink(pending.nodes)
        elif pending.action == ControlAction.CHECKPOINT_AND_REQUEUE:
            self._wait_for_requeue(pending, cfg)
        else:
            log.info("generation %d: relaunching on the same %d node(s)", pending.generation,
                     n_nodes)

    def _launch(self, cfg: LaunchConfig, nodes: list[str]) -> int:
        self.launches += 1
        master = (_while_unreachable(lambda: slurm.node_addr(nodes[0]), "scontrol show node")
                  if nodes else "127.0.0.1")
        env = dict(self.env)
        # the batch script runs on the allocation's first node (sbatch(1)), where rank 0 runs
        local = not nodes or self.env.get("SLURMD_NODENAME") == nodes[0] or master.startswith("127.")
        env.update(self.launch_env(cfg, master, local).to_env())
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: one worker per GPU, not per core
        if master.startswith("127."):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback-only dev cluster
        cmd = [
            "srun", f"--nodes={cfg.nodes}", f"--ntasks={cfg.world_size}",
            f"--ntasks-per-node={cfg.workers_per_node}", "--kill-on-bad-exit=1",
            f"--job-name={self.env.get('SLURM_JOB_NAME', 'hpcsched')}",
            self.spec.python, "-m", "hpcsched.worker", self.spec.script, *self.spec.script_args,
        ]
        self._save_state(LauncherPhase.RUNNING, cfg)
        log.info("launch %d: generation %d, %d node(s) x %d worker(s), global batch %d "
                 "(local %d x %d accumulation), lr scale %.4g", self.launches, cfg.generation,
                 cfg.nodes, cfg.workers_per_node, cfg.batch.global_batch_size,
                 cfg.batch.local_batch_size, cfg.batch.accumulation_steps, cfg.lr_scale)
        proc = subprocess.Popen(cmd, env=env, cwd=self.spec.submit_dir or None)
        try:
            return proc.wait()
        finally:  # the workers are gone: no extension of theirs may hold GPUs
            cancel_all(self.jd)

    def launch_env(self, cfg: LaunchConfig, master_addr: str, local: bool = False) -> LaunchEnv:
        """What the workers of the next launch (number ``self.launches``) are told; ``local``:
        rank 0 runs on this node, so its store's port is checked free here first."""
        spec = self.spec
        return LaunchEnv(
            job_dir=str(self.jd.path), launch=self.launches, generation=cfg.generation,
            nodes=cfg.nodes, workers_per_node=cfg.workers_per_node, world_size=cfg.world_size,
            local_batch_size=cfg.batch.local_batch_size,
            accumulation_steps=cfg.batch.accumulation_steps,
            global_batch_size=cfg.batch.global_batch_size, lr_scale=cfg.lr_scale,
            checkpoint_dir=spec.checkpoint_dir, checkpoint_interval=spec.checkpoint_interval,
            mtbf=spec.mtbf,
            record_samples=spec.record_samples, python=spec.python, inplace_shrink=True,
            master_addr=master_addr,
            master_port=master_port(self.job_id, self.launches, port_is_free if local else None),
            extensions=True)

    @property
    def _resize_script(self) -> Path:
        return self.jd.path / f"slurm_job_{self.job_id}_resize.sh"

    def _adopt_resize_script(self) -> None:
        """Apply the environment of a resize made since the last look (by us, or in place by
        the workers' rank 0), so the next srun sees the allocation the job really has."""
        try:
            st = self._resize_script.stat()
        except FileNotFoundError:
            return
        if st.st_mtime_ns == getattr(self, "_resize_seen", None):
            return
        self._resize_seen = st.st_mtime_ns
        setv, unset = slurm.parse_resize_script(self._resize_script.read_text())
        for k in unset:
            self.env.pop(k, None)
        self.env.update(setv)
        self.resizes += 1
        log.info("allocation is now %s", self.env.get("SLURM_JOB_NODELIST"))

    def _shrink(self, nodes: int) -> None:
        """Release nodes from inside the job; the next launch adopts Slurm's resize script.

        When Slurm refuses, the next launch runs on the allocation the job still has
        (:func:`~hpcsched.job.allocation.shrink_from_inside`'s error policy, logged there).
        """
        log.info("shrinking job %s to %d node(s)", self.job_id, nodes)
        self._save_state(LauncherPhase.RESIZING, target_nodes=nodes)
        self._forget_resize_scripts()
        if shrink_from_inside(self.job_id, nodes, self.jd.path) is not None:
            log.warning("relaunching on the current %s", self.env.get("SLURM_JOB_NODELIST"))
            return
        if not self._resize_script.exists():
            log.warning("Slurm wrote no resize script; reading the allocation from squeue")
            info = slurm.job_info(self.job_id)
            for k in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"):
                self.env.pop(k, None)
            self.env.update({"SLURM_JOB_NODELIST": info.nodes, "SLURM_NODELIST": info.nodes,
                             "SLURM_JOB_NUM_NODES": str(info.node_count),
                             "SLURM_NNODES": str(info.node_count)})

    def _near_time_limit(self) -> bool:
        """Less than :data:`~hpcsched.job.submit.PRE_TIMEOUT_S` seconds are left before the
        job's time limit (``squeue %L``; False when there is none or Slurm cannot say)."""
        try:
            left = slurm.time_left(self.job_id)
            return left is not None and duration_seconds(left) < PRE_TIMEOUT_S
        except (slurm.SlurmError, ValueError):
            return False

    def _requeue_self(self, cfg: LaunchConfig, ack: ctl.Ack) -> None:
        """The workers checkpointed and stopped on Slurm's signal: ``scontrol requeue`` this job
        (Slurm ends this batch step and reruns the script, which resumes from the checkpoint)
        and wait for the end. Returns only if Slurm refuses (a ``--no-requeue`` job) or does not
        end the step within ``--requeue-timeout`` seconds: the caller relaunches."""
        log.info("workers checkpointed at step %d on Slurm's signal (%s); requeueing job %s",
                 ack.step, ack.checkpoint or "no checkpoint directory", self.job_id)
        self._requeue_now(cfg)

    def _requeue_now(self, cfg: LaunchConfig | None) -> None:
        """``scontrol requeue`` this job and wait for Slurm to end this step (see
        :meth:`_requeue_self`)."""
        self._save_state(LauncherPhase.REQUEUED, cfg)
        try:
            _while_unreachable(lambda: slurm.requeue(self.job_id), "scontrol requeue")
        except slurm.SlurmError as exc:
            log.warning("Slurm did not requeue job %s (%s): training on from the checkpoint "
                        "until the time limit", self.job_id, exc)
            return
        self._await_requeue()
        log.warning("job %s still runs %.0f s after its requeue; relaunching", self.job_id,
                    self.requeue_timeout)

    def _await_requeue(self) -> None:
        """Sleep up to ``--requeue-timeout`` seconds: Slurm ends this batch step when the
        requeue takes effect, so returning means it did not come."""
        deadline = time.monotonic() + self.requeue_timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)

    def _wait_for_requeue(self, pending: ctl.Control, cfg: LaunchConfig) -> None:
        log.info("checkpointed for generation %d; waiting up to %.0f s to be requeued at %d "
                 "node(s)", pending.generation, self.requeue_timeout, pending.nodes)
        self._save_state(LauncherPhase.AWAITING_REQUEUE, cfg, target_nodes=pending.nodes)
        self._await_requeue()
        log.warning("no requeue within %.0f s; resuming on the current allocation",
                    self.requeue_timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcsched.launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--requeue-timeout", type=float,
                        default=float(os.environ.get("HPCSCHED_REQUEUE_TIMEOUT", "300")),
                        help="seconds to wait for a requested requeue before resuming (default 300)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("HPCSCHED_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s hpcsched-launcher %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return Launcher(args.job_dir, args.requeue_timeout).run()
    except (ctl.ProtocolError, slurm.SlurmError) as exc:
        log.error("launcher failed: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
