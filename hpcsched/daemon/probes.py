"""The GPU probes (docs/slurm-plugins.md): ingest the files the prolog writes
(``slurm-plugins/prolog-gpu-probe``, :mod:`hpcsched.probe`) into the store's ``gpu_probes``, and
report, and optionally drain, a GPU far slower than its peers.

* :func:`ingest_spool`: each ``*.json`` in the spool directory is parsed
  (:func:`hpcsched.protocol.probes.parse_record`), stored, then deleted; a file that is not a
  valid record is logged and moved to ``rejected/`` beside it, never read twice, and never stops
  the round. At most :data:`MAX_FILES` files per round (the rest wait for the next).
* :func:`slow_gpus` (pure): a GPU is slow when its latest score is below ``slow_fraction`` x the
  median of the latest scores of its peers, the other GPUs of the same kind and model, once it
  has ``min_peers`` of them. The same test as PAL's per-GPU variability classes, applied to a
  benchmark instead of job step times (Jain et al., SC'24, §3); the median, not the mean, so one
  slow GPU does not pull its peers' reference down.
* :class:`ProbeWatch`: the per-round driver the daemon calls: ingest, then judge the GPUs probed
  this round, warn, and with ``[probe] drain_slow`` drain their nodes
  (:func:`hpcsched.slurm.commands.drain_node`).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched.daemon.config import ProbeSettings
from hpcsched.daemon.store import GpuProbeRow, Store
from hpcsched.protocol.files import ProtocolError, read_bounded
from hpcsched.protocol.probes import MAX_FILE_BYTES, ProbeRecord, parse_record
from hpcsched.slurm import commands

log = logging.getLogger("hpcsched.daemon.probes")

#: probe files ingested per round; more wait for the next round
MAX_FILES = 1000
#: where files that are not valid probe records go, under the spool directory
REJECTED = "rejected"
#: seconds after which a prolog's leftover temporary file (``.<name>.*.tmp``) is removed
STALE_TMP = 3600.0


# -- the decision (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class PeerRatio:
    """A GPU's latest score against its peers': ``ratio`` = score / ``peer_median`` (1.0: as
    fast as its peers' median), over ``peers`` other GPUs of its kind and model."""

    probe: GpuProbeRow
    ratio: float
    peer_median: float
    peers: int

    def reason(self) -> str:
        """The drain reason Slurm keeps (``sinfo -R``)."""
        p = self.probe
        return (f"hpcsched: GPU {p.gpu_index} at {self.ratio:.2f}x its peers' median (probe of job "
                f"{p.job_id or '?'}: {p.score:.1f} vs {self.peer_median:.1f} {p.unit}, "
                f"{self.peers} peers)")


def peer_ratios(latest: Iterable[GpuProbeRow], min_peers: int = 1) -> dict[str, PeerRatio]:
    """``{gpu_key: PeerRatio}`` for every GPU with at least ``min_peers`` peers (other GPUs with
    the same ``kind`` and ``model``) among ``latest`` (one probe per GPU: the store's
    :meth:`~hpcsched.daemon.store.Store.latest_gpu_probes`). GPUs with fewer are left out."""
    groups: dict[tuple[str, str], list[GpuProbeRow]] = defaultdict(list)
    for p in latest:
        groups[(p.kind, p.model)].append(p)
    out = {}
    for members in groups.values():
        for p in members:
            peers = [q.score for q in members if q.gpu_key != p.gpu_key]
            if len(peers) < max(1, min_peers):
                continue
            median = statistics.median(peers)
            out[p.gpu_key] = PeerRatio(p, p.score / median, median, len(peers))
    return out


def slow_gpus(latest: Iterable[GpuProbeRow], slow_fraction: float, min_peers: int = 2
              ) -> list[PeerRatio]:
    """The GPUs whose latest score is below ``slow_fraction`` x their peers' median (see
    :func:`peer_ratios`), slowest first."""
    ratios = peer_ratios(latest, min_peers)
    return sorted((r for r in ratios.values() if r.ratio < slow_fraction), key=lambda r: r.ratio)


# -- ingesting the spool ----------------------------------------------------------------------


@dataclass
class IngestResult:
    """One pass over the spool: ``rows`` stored, ``files`` ingested (and deleted), ``rejected``
    ``[(file name, why)]`` moved to ``rejected/``, and the ``records`` read."""

    rows: int = 0
    files: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    records: list[ProbeRecord] = field(default_factory=list)


def _rows(rec: ProbeRecord) -> list[dict]:
    return [dict(time=rec.time, node=rec.node, gpu_index=g.index, gpu_uuid=g.uuid or None,
                 model=g.model, kind=rec.kind, score=g.score, unit=g.unit, seconds=g.seconds,
                 job_id=rec.job_id) for g in rec.gpus]


def _reject(spool: Path, name: str, why: str) -> None:
    log.warning("GPU probe %s: %s; moved to %s/", spool / name, why, REJECTED)
    try:
        (spool / REJECTED).mkdir(exist_ok=True)
        os.replace(spool / name, spool / REJECTED / name)
    except OSError as exc:
        log.warning("GPU probe %s: cannot move it aside (%s); deleting it", spool / name, exc.strerror)
        _unlink(spool / name)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("GPU probe %s: cannot delete it: %s", path, exc.strerror)


def _names(spool: Path, now: float) -> list[str]:
    """The probe files waiting (oldest name order), at most :data:`MAX_FILES`; removes stale
    temporary files of prologs killed mid-write."""
    names = []
    with os.scandir(spool) as it:
        for e in it:
            if e.name.startswith("."):
                if e.name.endswith(".tmp") and e.is_file(follow_symlinks=False):
                    try:
                        if now - e.stat(follow_symlinks=False).st_mtime > STALE_TMP:
                            _unlink(Path(e.path))
                    except OSError:
                        pass
                continue
            if e.name.endswith(".json"):
                names.append(e.name)
            if len(names) >= 10 * MAX_FILES:
                break
    return sorted(names)[:MAX_FILES]


def read_probe(path: Path) -> ProbeRecord:
    """One probe file, checked.

    Raises:
        ProtocolError: not a regular file, over :data:`~hpcsched.protocol.probes.MAX_FILE_BYTES`,
            not UTF-8 JSON, or not a valid record.
    """
    raw = read_bounded(path, MAX_FILE_BYTES)
    if raw is None:
        raise ProtocolError("vanished")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    return parse_record(data)


def ingest_spool(store: Store, spool: Path, now: float | None = None) -> IngestResult:
    """Store the probes waiting in ``spool`` and delete their files (see the module docstring).

    Never raises for what the files hold; a missing spool directory is an empty pass. The
    store's own errors propagate (the files then stay, and the next pass stores them).
    """
    now = time.time() if now is None else now
    res = IngestResult()
    try:
        names = _names(spool, now)
    except FileNotFoundError:
        return res
    except OSError as exc:
        log.warning("GPU probes: cannot list %s: %s", spool, exc.strerror)
        return res
    good: list[str] = []
    for name in names:
        try:
            rec = read_probe(spool / name)
        except ProtocolError as exc:
            why = str(exc).removeprefix(f"{spool / name}: ")
            if why != "vanished":
                _reject(spool, name, why)
                res.rejected.append((name, why))
            continue
        for e in rec.errors:
            log.warning("GPU probe of job %s on %s failed: %s", rec.job_id, rec.node, e)
        res.records.append(rec)
        good.append(name)
    res.rows = store.add_gpu_probes([r for rec in res.records for r in _rows(rec)])
    for name in good:   # after the rows are committed: a crash stores a file twice, never loses it
        _unlink(spool / name)
    res.files = len(good)
    return res


# -- the per-round driver ---------------------------------------------------------------------


@dataclass
class ProbeReport:
    """What :meth:`ProbeWatch.round` did: the ingest pass, the GPUs probed this round found
    ``slow``, and the nodes ``drained`` (``{node: reason}``; empty in dry-run or without
    ``drain_slow``)."""

    ingest: IngestResult = field(default_factory=IngestResult)
    slow: list[PeerRatio] = field(default_factory=list)
    drained: dict[str, str] = field(default_factory=dict)


class ProbeWatch:
    """Every round: ingest the spool, judge the GPUs probed in it against their peers, warn of
    the slow ones, and drain their nodes when ``settings.drain_slow`` (not in ``dry_run``).

    ``drain(node, reason)`` defaults to :func:`hpcsched.slurm.commands.drain_node`. A GPU is
    judged once per new probe, so a slow GPU is reported (and its node drained) once per probe,
    not every round.
    """

    def __init__(self, settings: ProbeSettings, store: Store, *, dry_run: bool = False,
                 timeout: float = commands.DEFAULT_TIMEOUT,
                 drain: Callable[[str, str], None] | None = None):
        self.settings, self.store, self.dry_run = settings, store, dry_run
        self._drain = drain or (lambda node, reason: commands.drain_node(node, reason, timeout))

    def round(self, now: float | None = None) -> ProbeReport:
        """One pass (see the class docstring). Never raises for Slurm or the files."""
        rep = ProbeReport()
        if not self.settings.spool_dir:
            return rep
        rep.ingest = ingest_spool(self.store, Path(self.settings.spool_dir).expanduser(), now)
        if not rep.ingest.records:
            return rep
        fresh = {(r.node, g.index) for r in rep.ingest.records for g in r.gpus}
        latest = self.store.latest_gpu_probes()
        rep.slow = [s for s in slow_gpus(latest, self.settings.slow_fraction, self.settings.min_peers)
                    if (s.probe.node, s.probe.gpu_index) in fresh]
        for s in rep.slow:
            log.warning("slow GPU on %s: %s", s.probe.node, s.reason())
        self._drain_nodes(rep)
        return rep

    def _drain_nodes(self, rep: ProbeReport) -> None:
        by_node: dict[str, list[PeerRatio]] = defaultdict(list)
        for s in rep.slow:
            by_node[s.probe.node].append(s)
        for node, slow in by_node.items():
            reason = slow[0].reason() + (f" and {len(slow) - 1} more GPU(s)" if len(slow) > 1 else "")
            if not self.settings.drain_slow:
                continue
            if self.dry_run:
                log.warning("dry run: would drain %s: %s", node, reason)
                continue
            try:
                self._drain(node, reason)
            except (commands.SlurmError, ValueError) as exc:
                log.warning("cannot drain %s: %s", node, exc)
                continue
            log.warning("drained %s: %s", node, reason)
            rep.drained[node] = reason

