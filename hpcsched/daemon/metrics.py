"""The daemon's Prometheus metrics: one recorder per daemon, fed once per round from its report.

:class:`DaemonMetrics` owns a :class:`prometheus_client.CollectorRegistry` of its own (never the
process-wide default one, so tests can run several daemons in one process) and serves it with
prometheus_client's HTTP server (:meth:`DaemonMetrics.serve`: ``/metrics``, the text exposition
format). ``hpcsched daemon --metrics-port PORT`` (or ``[daemon] metrics_port``) turns it on;
``docs/metrics.md`` lists every series and ``docs/grafana-hpcsched.json`` is a dashboard of them.

The daemon calls :meth:`~DaemonMetrics.record_round` once at the end of each round, with the
round's :class:`~hpcsched.daemon.round.RoundReport`, and :meth:`~DaemonMetrics.record_actions`
after each actuation tick between rounds; nothing else in the daemon knows about metrics. Every
series is named ``hpcsched_...`` with its base unit in the name (``_seconds``, ``_total``,
``_samples_per_second``, ``_flops``, ``_ratio``), per Prometheus' naming rules. Per-job series
carry the Slurm job id as ``job_id`` (not ``job``: Prometheus sets ``job`` itself, the scrape
job's name) and are removed when the job leaves the round's snapshot (it ended, or is no longer
eligible), so the label sets stay bounded by the jobs alive now. A recorder never raises into
the round: a bug in it is logged and counted as ``hpcsched_errors_total{kind="metrics"}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from hpcsched import __version__, slurm
from hpcsched.daemon.phases import ResizePhase
from hpcsched.model.snapshot import ClusterSnapshot, JobView
from hpcsched.perf.model import model_for
from hpcsched.protocol.batching import BatchSizeError, fit_batch
from hpcsched.protocol.kinds import ChangeKind, SlurmState
from hpcsched.protocol.probes import KIND_CPU, KIND_CUDA, UNITS

if TYPE_CHECKING:
    from hpcsched.daemon.round import RoundReport

log = logging.getLogger("hpcsched.daemon.metrics")

#: Round durations, seconds: a round is 2 Slurm calls plus file reads when idle (well under a
#: second), up to tens of seconds with Slurm slow (``slurm_timeout`` is 20 s by default).
ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
#: Policy decision times, seconds (``benchmarks/policy_decision.py``'s targets: <= 50 ms at 64
#: GPUs, <= 1 s at 4,096).
POLICY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The ``outcome`` labels of :attr:`DaemonMetrics.resizes`.
OUTCOMES = ("applied", "refused", "failed")
#: FLOP/s per unit of a probe's score (:mod:`hpcsched.probe.bench`: TFLOP/s on GPUs, GFLOP/s for
#: the CPU stand-in); Prometheus series are in base units
_FLOPS = {UNITS[KIND_CUDA]: 1e12, UNITS[KIND_CPU]: 1e9}
#: Slurm job states always exported (0 when no job is in them); other states appear while a
#: managed job is in them.
BASE_STATES = (SlurmState.PENDING, SlurmState.RUNNING)
#: In a ``failed`` outcome, the job's own refusal: :mod:`hpcsched.daemon.phases` fails a resize
#: with "job <id> rejected generation <g>: <message>" when the job's ack says ``rejected``.
_REFUSED = " rejected generation "


def outcome_of(phase: str) -> str | None:
    """The ``outcome`` label of a resize's phase after a step (:attr:`RoundReport.outcomes`):
    ``applied`` (reached ``running``), ``refused`` (failed: the job rejected the generation),
    ``failed`` (failed otherwise: superseded, the job ended, Slurm refused, timed out), or None
    while it is still in flight (``requested`` .. ``rescheduled``, ``interrupted``)."""
    if phase == ResizePhase.RUNNING:
        return "applied"
    if phase.startswith(ResizePhase.FAILED):
        return "refused" if _REFUSED in phase else "failed"
    return None


def predicted_throughput(job: JobView) -> float | None:
    """The throughput model's samples/s for ``job`` at its configuration in force (its GPUs,
    nodes and global batch size cut as the job cuts it), the figure the policies start from
    (:func:`hpcsched.perf.model.model_for`: Pollux's step-time model, OSDI'21 §3.2, or the
    linear fit); None without a model or when the batch size does not fit the GPUs."""
    model = model_for(job)
    if model is None or job.gpus <= 0:
        return None
    try:
        cfg = fit_batch(job.batch_size, job.gpus, min_global=job.min_batch_size,
                        max_global=job.max_batch_size,
                        max_local_batch_size=job.max_local_batch_size)
    except BatchSizeError:
        return None
    return model.throughput(cfg, max(1, job.nodes))


class _LabelledGauge:
    """A gauge whose whole label set is replaced at once: series absent from the new values are
    removed (not left at their last value), so ended jobs do not linger."""

    def __init__(self, gauge: Gauge):
        self.gauge = gauge
        self.keys: set[tuple[str, ...]] = set()

    def replace(self, values: Mapping[tuple[str, ...], float]) -> None:
        for key, v in values.items():
            self.gauge.labels(*key).set(v)
        for key in self.keys - set(values):
            self.gauge.remove(*key)
        self.keys = set(values)


class DaemonMetrics:
    """The daemon's series in a registry of their own (module docstring; ``docs/metrics.md``).

    Args:
        registry: where the series live; None: a new :class:`CollectorRegistry`.
    """

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.round_duration = Histogram(
            "hpcsched_round_duration_seconds",
            "Wall time of a daemon round, observe to record, seconds (Daemon.round)",
            buckets=ROUND_BUCKETS, registry=r)
        self.last_round = Gauge(
            "hpcsched_last_round_timestamp_seconds",
            "When the latest daemon round ended, Unix seconds", registry=r)
        self.slurm_calls = Counter(
            "hpcsched_slurm_calls",
            "Slurm commands (and pyslurm loads) the daemon made, calls (hpcsched.slurm.calls); "
            "during: round, or between_rounds (actuation ticks)", ["during"], registry=r)
        self.policy_time = Histogram(
            "hpcsched_policy_decision_seconds",
            "Time of a round's decision (measured costs, policy, reconcile), seconds",
            buckets=POLICY_BUCKETS, registry=r)
        self.decisions = Counter(
            "hpcsched_decisions",
            "Changes the rounds decided, by kind (batch, shrink, grow, pending, preempt), "
            "changes; dry_run: decided by a dry-run daemon, never carried out",
            ["kind", "dry_run"], registry=r)
        self.resizes = Counter(
            "hpcsched_resizes",
            "Resizes by journal kind and outcome when they end, resizes: applied, refused (by "
            "the job), failed", ["kind", "outcome"], registry=r)
        self.in_flight = _LabelledGauge(Gauge(
            "hpcsched_resizes_in_flight",
            "Resizes in the journal not yet running or failed, by kind, resizes", ["kind"],
            registry=r))
        self.jobs = _LabelledGauge(Gauge(
            "hpcsched_jobs",
            "Managed jobs Slurm lists, by Slurm state, jobs (squeue --json)", ["state"],
            registry=r))
        self.gpus_held = Gauge(
            "hpcsched_gpus_held",
            "GPUs held by running managed jobs (extension jobs included), GPUs", registry=r)
        self.gpus_usable = Gauge(
            "hpcsched_gpus_usable",
            "GPUs on usable nodes of the managed partitions, GPUs (sinfo --json)", registry=r)
        self.measured = _LabelledGauge(Gauge(
            "hpcsched_job_measured_throughput_samples_per_second",
            "A running job's latest measured throughput, samples/s (its progress.json)",
            ["job_id"], registry=r))
        self.predicted = _LabelledGauge(Gauge(
            "hpcsched_job_predicted_throughput_samples_per_second",
            "The throughput model's prediction for a running job at its configuration in force, "
            "samples/s (hpcsched.perf.model)", ["job_id"], registry=r))
        self.gpu_speed = _LabelledGauge(Gauge(
            "hpcsched_gpu_relative_speed_ratio",
            "A GPU's speed relative to the median GPU of the jobs that ran on it, ratio (1 = "
            "median; measured from jobs' per-rank compute times)", ["node", "gpu", "app_class"],
            registry=r))
        self.probe_flops = _LabelledGauge(Gauge(
            "hpcsched_gpu_probe_flops",
            "A GPU's latest probe score (slurm-plugins/prolog-gpu-probe), FLOP/s: fp16 matmul on "
            "the GPU, or float32 matmul on the node's CPU for the stand-in (kind cpu-stand-in)",
            ["node", "gpu", "kind"], registry=r))
        self.probe_vs_peers = _LabelledGauge(Gauge(
            "hpcsched_gpu_probe_vs_peers_ratio",
            "A GPU's latest probe score over the median of its peers' (same kind and model), ratio "
            "(below [probe] slow_fraction: slow)", ["node", "gpu"], registry=r))
        self.errors = Counter(
            "hpcsched_errors",
            "Daemon errors by kind, errors: slurm (a round ended by a Slurm error, nothing "
            "decided), resize_interrupted (Slurm did not answer a resize step), resize_failed, "
            "metrics (the recorder itself)", ["kind"], registry=r)
        for kind in ("slurm", "resize_interrupted", "resize_failed", "metrics"):
            self.errors.labels(kind)   # exported at 0 from the start: rate() needs a baseline
        for during in ("round", "between_rounds"):
            self.slurm_calls.labels(during)
        for kind in ChangeKind:
            for outcome in OUTCOMES:
                self.resizes.labels(str(kind), outcome)
            for dry in ("false", "true"):
                self.decisions.labels(str(kind), dry)
        self.build = Info("hpcsched_build", "The running hpcsched: its version", registry=r)
        self.build.info({"version": __version__})
        self._calls_seen = slurm.calls()
        self.server: Any = None

    # -------------------------------------------------------------------- recording
    def record_round(self, rep: RoundReport, *, dry_run: bool = False) -> None:
        """Record one round from its report (never raises; see the module docstring)."""
        try:
            self._record_round(rep, dry_run)
        except Exception:   # noqa: BLE001 - metrics must never stop the scheduler
            log.exception("round %s: metrics not recorded", rep.round_id)
            self.errors.labels("metrics").inc()

    def record_actions(self, rep: RoundReport) -> None:
        """Record the resize steps of an actuation tick between rounds (never raises)."""
        try:
            self._record_outcomes(rep)
            self._count_calls(0)
        except Exception:   # noqa: BLE001
            log.exception("actuation tick: metrics not recorded")
            self.errors.labels("metrics").inc()

    def _record_round(self, rep: RoundReport, dry_run: bool) -> None:
        self.round_duration.observe(rep.duration)
        self.last_round.set(time.time())
        self._count_calls(rep.slurm_calls)
        if rep.error is not None:
            self.errors.labels("slurm").inc()
            return   # nothing was observed or decided: the gauges keep the last round's values
        self.policy_time.observe(rep.policy_seconds)
        for c in rep.changes:
            self.decisions.labels(str(c.kind), "true" if dry_run else "false").inc()
        self._record_outcomes(rep)
        self._record_jobs(rep.slurm_states, rep.snapshot)
        probed = [g for g in rep.gpus if g.score is not None]
        self.probe_flops.replace({(g.node, g.gpu_index, g.kind): g.score * _FLOPS[g.unit]
                                  for g in probed if g.unit in _FLOPS})
        self.probe_vs_peers.replace({(g.node, g.gpu_index): g.vs_peers for g in probed
                                     if g.vs_peers is not None})

    def _count_calls(self, in_round: int) -> None:
        """Split the process's Slurm calls since the last record into this round's and the
        rest (actuation ticks between rounds)."""
        total = slurm.calls()
        between = max(0, total - self._calls_seen - in_round)
        self._calls_seen = total
        self.slurm_calls.labels("round").inc(in_round)
        self.slurm_calls.labels("between_rounds").inc(between)

    def _record_outcomes(self, rep: RoundReport) -> None:
        open_by_kind: dict[tuple[str, ...], float] = {}
        for job_id, phase in rep.outcomes.items():
            kind = str(rep.kinds.get(job_id, "unknown"))
            outcome = outcome_of(str(phase))
            if outcome is not None:
                self.resizes.labels(kind, outcome).inc()
                if outcome != "applied":
                    self.errors.labels("resize_failed").inc()
            else:
                open_by_kind[(kind,)] = open_by_kind.get((kind,), 0) + 1
                if phase == "interrupted":
                    self.errors.labels("resize_interrupted").inc()
        self.in_flight.replace(open_by_kind)

    def _record_jobs(self, states: Mapping[str, str], snapshot: ClusterSnapshot | None) -> None:
        by_state: dict[tuple[str, ...], float] = {(s,): 0 for s in BASE_STATES}
        for state in states.values():
            by_state[(state,)] = by_state.get((state,), 0) + 1
        self.jobs.replace(by_state)
        if snapshot is None:
            return
        running = [j for j in snapshot.jobs if j.state == SlurmState.RUNNING]
        self.gpus_held.set(sum(j.gpus for j in running))
        self.gpus_usable.set(sum(n.gpus for n in snapshot.nodes if n.usable))
        self.measured.replace({(j.job_id,): j.throughput for j in running if j.throughput > 0})
        predicted = ((j.job_id, predicted_throughput(j)) for j in running)
        self.predicted.replace({(k,): v for k, v in predicted if v is not None})
        self.gpu_speed.replace(_speeds(snapshot))

    # ------------------------------------------------------------------ serving
    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread (prometheus_client's
        :func:`~prometheus_client.start_http_server`); ``port`` 0 takes a free one. Returns the
        port listened on.

        Raises:
            OSError: the address cannot be bound (port in use, address not on this host).
        """
        self.server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving (tests; the daemon's server dies with the process)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _speeds(snapshot: ClusterSnapshot) -> dict[tuple[str, ...], float]:
    """``(node, gpu index, application class)`` -> relative speed (1 / the snapshot's slowdown,
    :func:`hpcsched.daemon.views.measured_gpu_views`)."""
    out: dict[tuple[str, ...], float] = {}
    for g in snapshot.gpus:
        for app, slowdown in g.slowdown:
            if slowdown > 0:
                out[(g.node, str(g.index), app)] = 1.0 / slowdown
    return out


__all__ = ["BASE_STATES", "OUTCOMES", "DaemonMetrics", "outcome_of", "predicted_throughput"]
