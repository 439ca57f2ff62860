"""``hpcsched daemon``: the service around :class:`~hpcsched.daemon.round.Daemon` -- settings
(and their reload on ``SIGHUP``), preflight checks, the host lock and the store's lease
(one active daemon per cluster), the Prometheus endpoint, and the loop of rounds with the
actuation ticks and event checks between them (``docs/daemon.md``)."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import time

import click

from hpcsched.daemon import preflight
from hpcsched.daemon.between import SubmitStamp
from hpcsched.daemon.config import ConfigError, Settings, load
from hpcsched.daemon.leadership import HostLock, Leadership
from hpcsched.daemon.metrics import DaemonMetrics
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.site_limits import read_site_limits
from hpcsched.daemon.store import Store
from hpcsched.policies import POLICIES, PolicyError
from hpcsched.policies.base import rounds_on_events

log = logging.getLogger("hpcsched.daemon")

#: glibc's mallopt(3) parameter number of ``M_MMAP_THRESHOLD`` (malloc.h)
M_MMAP_THRESHOLD = -3
#: the size from which the daemon's C heap maps blocks of their own (glibc's initial default)
MMAP_THRESHOLD = 128 * 1024
#: seconds between two looks at Slurm that submissions start (``[daemon] submit_stamp``) at least
SUBMIT_CHECK_GAP = 1.0


def steady_heap() -> bool:
    """Keep the daemon's resident memory at what its rounds hold, not at the peak of their
    largest transient allocations: fix glibc's mmap threshold at 128 KiB (mallopt(3),
    ``M_MMAP_THRESHOLD``), so that blocks from that size up are mapped alone and returned to
    the system when freed. Left dynamic (glibc's default), the threshold rises to the size of
    the largest such block freed so far, and later ones come from the heap, which keeps their
    pages; a round parses ``squeue --json`` for every job, megabytes at thousands of jobs
    (``docs/daemon.md``, "At scale"). Returns False where the C library has no ``mallopt``
    (not glibc): nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system after a round: ``malloc_trim(0)``
    (malloc_trim(3); glibc returns free pages anywhere in the heap, not only at its top). A
    round's parse of ``squeue --json`` frees hundreds of thousands of small blocks between the
    few it keeps; the holes they leave stay resident otherwise, and the daemon's RSS rises in
    steps with the largest observation it has parsed (``docs/daemon.md``, "Memory"). Returns
    False where the C library has no ``malloc_trim`` (not glibc): nothing changes."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    malloc_trim(0)
    return True


def _load_settings(config: str | None, overrides: dict) -> Settings:
    settings = load(config, policy_names=POLICIES)
    d = settings.daemon
    changes = {k: v for k, v in overrides.items() if v is not None}
    if changes:
        from dataclasses import replace

        settings = replace(settings, daemon=replace(d, **changes))
    return settings


def _serve_metrics(port: int, addr: str) -> DaemonMetrics | None:
    """The Prometheus recorder, its endpoint listening on ``addr:port`` (None: ``port`` 0, off).
    Started once: a SIGHUP reload keeps it (a new port takes a restart). An address that cannot
    be bound is a one-line error (ClickException), not a traceback."""
    if not port:
        return None
    metrics = DaemonMetrics()
    try:
        metrics.serve(port, addr)
    except OSError as exc:
        raise click.ClickException(
            f"metrics endpoint: cannot listen on {addr}:{port}: {exc.strerror or exc}") from None
    log.info("Prometheus metrics at http://%s:%d/metrics", addr, port)
    return metrics


def _rounds_on_events(daemon: Daemon, d) -> bool:
    """``d.event_rounds`` and the daemon's policy asks for rounds at events (``round_on_events``)."""
    return rounds_on_events(getattr(daemon, "policy", None), d.event_rounds)


def _submit_stamp(d) -> SubmitStamp:
    """The submission stamp the daemon watches: ``[daemon] submit_stamp``, else the job_submit
    plugin's own ``submit_stamp`` from its settings file (``[daemon] site_limits``), else none."""
    path = d.submit_stamp or read_site_limits(d.site_limits).submit_stamp
    if path:
        log.info("watching %s for other users' submissions (submit_stamp)", path)
    return SubmitStamp(path)


def _between_rounds(daemon: Daemon, d, t0: float, state: dict,
                    hold=lambda: True, stamp: SubmitStamp | None = None) -> str | None:
    """Wait until ``d.round_interval`` seconds after ``t0`` (monotonic), a stop or a reload,
    advancing resizes in flight every ``d.actuation_interval`` seconds meanwhile, each time only
    if ``hold()`` (the cluster's lease, renewed: :class:`~hpcsched.daemon.leadership.
    Leadership`) says this daemon still runs the cluster; if not, returns at once.

    For a policy that rounds on events (:func:`_rounds_on_events`), also checks every
    ``d.event_poll`` seconds, the first one ``d.event_poll`` seconds after the call (so at most
    one early round per ``event_poll``), whether a managed job ended or a new one pends
    (:meth:`Daemon.event_since_round`), and returns its reason at once if so; with ``stamp``
    (the job_submit plugin's :class:`SubmitStamp`), also as soon as another user has submitted
    a job, at most once per :data:`SUBMIT_CHECK_GAP` seconds. Returns None otherwise.
    """
    now = time.monotonic()
    next_step = now + d.actuation_interval
    watch = _rounds_on_events(daemon, d)
    next_check = now + d.event_poll if watch else math.inf
    nap = min(0.2, d.round_interval, d.actuation_interval, d.event_poll if watch else math.inf)
    submitted, checked = False, -math.inf
    while not state["stop"] and not state["reload"] and (
            time.monotonic() - t0 < d.round_interval):
        if time.monotonic() >= next_step:
            if not hold():
                return None
            daemon.actuate()
            next_step = time.monotonic() + d.actuation_interval
        submitted = watch and (submitted or (stamp is not None and stamp.changed()))
        now = time.monotonic()
        if now >= next_check or (submitted and now - checked >= SUBMIT_CHECK_GAP):
            submitted, checked = False, now
            reason = daemon.event_since_round()
            if reason:
                log.info("round early: %s", reason)
                return reason
            next_check = time.monotonic() + d.event_poll
        time.sleep(nap)
    return None


def _preflight(settings: Settings) -> None:
    """The checks before the daemon starts: exit with status 2, saying why, when it must not
    start (a ``[daemon] partitions`` entry Slurm lacks); warn when the control directory is
    not set."""
    refusal = preflight.start_refusal(settings)   # a [daemon] partitions entry Slurm lacks
    if refusal:
        click.echo(refusal, err=True)
        raise SystemExit(2)
    if unset := preflight.control_dir_unset(settings):
        log.warning("%s", unset)


def _reload_settings(config, overrides: dict, settings: Settings, daemon: Daemon, store: Store,
                     metrics: DaemonMetrics | None) -> tuple[Settings, Daemon]:
    """On SIGHUP: the configuration read again from ``config`` (with the command line's
    ``overrides``) and a daemon made from it on ``store`` and the same ``metrics`` endpoint; the old
    ``settings`` and ``daemon``, with an error logged, when the new configuration is bad."""
    try:
        settings = _load_settings(config, overrides)
        # same endpoint, and the resize steps under way
        daemon = Daemon(settings, store=store, metrics=metrics, steps=daemon.steps)
        log.info("SIGHUP: configuration reloaded (policy %s, every %.0f s)",
                 daemon.policy.name, settings.daemon.round_interval)
    except (ConfigError, PolicyError) as exc:
        log.error("SIGHUP: configuration not reloaded, keeping the old one: %s", exc)
    return settings, daemon


@click.command("daemon")
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="TOML file (default: $HPCSCHED_CONFIG or /etc/hpcsched/hpcsched.toml).")
@click.option("--once", is_flag=True, help="Run one round and exit.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between rounds (overrides daemon.round_interval).")
@click.option("--dry-run", is_flag=True, default=None,
              help="Decide and record, never act (overrides daemon.dry_run).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this TCP port (/metrics; 0 = off; overrides "
                   "daemon.metrics_port; docs/metrics.md).")
@click.option("--metrics-addr", default=None,
              help="Address the metrics endpoint listens on (default 127.0.0.1: this host only, "
                   "the endpoint has no authentication; overrides daemon.metrics_addr).")
def daemon_command(config, once, interval, dry_run, metrics_port, metrics_addr):
    """Run the scheduler: every round observe Slurm, decide with the policy, resize jobs."""
    overrides = {"round_interval": interval, "dry_run": dry_run, "metrics_port": metrics_port,
                 "metrics_addr": metrics_addr}
    try:
        settings = _load_settings(config, overrides)
    except (ConfigError, PolicyError) as exc:
        raise click.ClickException(str(exc))
    logging.getLogger().setLevel(settings.daemon.log_level.upper())
    _preflight(settings)
    steady_heap()
    lock = HostLock(settings.daemon.lock_file)
    lock.acquire()
    store = Store(settings.daemon.database_url)
    rev = store.upgrade()
    lead = Leadership(store, settings.daemon.lease_seconds)
    metrics = _serve_metrics(settings.daemon.metrics_port, settings.daemon.metrics_addr)
    daemon = Daemon(settings, store=store, metrics=metrics)
    log.info("hpcsched daemon pid %d: policy %s, every %.0f s, %s, database at revision %s, "
             "control dir %s%s", os.getpid(), daemon.policy.name, settings.daemon.round_interval,
             daemon.backend.name, rev, daemon.control_dir,
             " (dry run)" if settings.daemon.dry_run else "")
    state = {"stop": False, "reload": False}

    def _stop(signum, _frame):
        log.info("%s: stopping after this round", signal.Signals(signum).name)
        state["stop"] = True

    def _reload(_signum, _frame):
        state["reload"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _reload)
    early = None   # the reason the last round ran early (None: it was a periodic round)
    stamp = _submit_stamp(settings.daemon)
    while True:
        if state["reload"]:
            state["reload"] = False
            settings, daemon = _reload_settings(config, overrides, settings, daemon, store, metrics)
            stamp = _submit_stamp(settings.daemon)
        if not lead.hold():   # a standby: another daemon runs this cluster's rounds
            if once:
                break
            lead.standby(lambda: state["stop"] or state["reload"])
            if state["stop"]:
                break
            early = None
            continue
        if early is None:   # an early round keeps the periodic rounds' times, as the simulator
            t0 = time.monotonic()
        daemon.round()
        trim_heap()
        if once or state["stop"]:
            break
        early = _between_rounds(daemon, settings.daemon, t0, state, lead.hold, stamp)
        if state["stop"]:
            break
    daemon.steps.close(store, settings.daemon.slurm_timeout)
    lead.release()
    log.info("hpcsched daemon stopped")
