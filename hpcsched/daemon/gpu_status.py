"""``hpcsched status --gpus``: every GPU the daemon knows, from its store: the latest probe
(slurm-plugins/prolog-gpu-probe; docs/slurm-plugins.md), that score against its peers', the
passive relative speed measured from the compute times of hpcsched jobs
(:meth:`~hpcsched.daemon.store.Store.gpu_speeds`), and whether it counts as slow
(:func:`hpcsched.daemon.probes.slow_gpus`'s test, with the daemon's ``[probe]`` settings).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from hpcsched.daemon.config import ProbeSettings
from hpcsched.daemon.probes import peer_ratios


@dataclass(frozen=True)
class GpuStatus:
    """One row of ``hpcsched status --gpus``. ``score`` in ``unit`` (None: never probed);
    ``vs_peers``: score / the median of its peers' latest scores (None: too few peers);
    ``relative_speed``: the passive measure (1.0 = its jobs' median rank; None: not measured)."""

    node: str
    gpu_index: str
    gpu_uuid: str | None = None
    kind: str = ""
    model: str = ""
    score: float | None = None
    unit: str = ""
    probed_at: float | None = None
    job_id: str | None = None
    vs_peers: float | None = None
    peers: int = 0
    relative_speed: float | None = None
    slow: bool = False


def _index_key(idx: str) -> tuple[int, str]:
    return (int(idx), idx) if idx.isdigit() else (1 << 30, idx)


def gpu_rows(store, settings: ProbeSettings | None = None) -> list[GpuStatus]:
    """The rows, by node and GPU index: each GPU probed (its latest probe) and each GPU with a
    passive measure only."""
    settings = settings or ProbeSettings()
    latest = store.latest_gpu_probes()
    ratios = peer_ratios(latest, settings.min_peers)
    speeds = store.gpu_speeds()
    rows: dict[tuple[str, str], GpuStatus] = {}
    for p in latest:
        r = ratios.get(p.gpu_key)
        rows[(p.node, p.gpu_index)] = GpuStatus(
            node=p.node, gpu_index=p.gpu_index, gpu_uuid=p.gpu_uuid, kind=p.kind, model=p.model,
            score=p.score, unit=p.unit, probed_at=p.time, job_id=p.job_id,
            vs_peers=None if r is None else r.ratio, peers=0 if r is None else r.peers,
            relative_speed=speeds.get((p.node, p.gpu_index)),
            slow=r is not None and r.ratio < settings.slow_fraction)
    for (node, idx), v in speeds.items():
        rows.setdefault((node, idx), GpuStatus(node=node, gpu_index=idx, relative_speed=v))
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], _index_key(k[1])))]


def gpus_json(rows: list[GpuStatus], settings: ProbeSettings) -> dict:
    """What ``hpcsched status --gpus --json`` prints: ``time`` (Unix s), the ``slow_fraction``
    and ``min_peers`` judged by, and one object per GPU (the fields of :class:`GpuStatus`)."""
    return {"time": time.time(), "slow_fraction": settings.slow_fraction,
            "min_peers": settings.min_peers, "gpus": [asdict(r) for r in rows]}


GPU_COLUMNS = ("NODE", "GPU", "UUID", "KIND", "SCORE", "VS PEERS", "PASSIVE", "PROBED", "SLOW")


def gpu_cells(r: GpuStatus) -> tuple[str, ...]:
    """One GPU's cells in :data:`GPU_COLUMNS` order ("-" where unknown)."""
    kind = r.kind + (f" {r.model}" if r.model else "") if r.kind else "-"
    return (r.node, r.gpu_index, r.gpu_uuid or "-", kind,
            f"{r.score:.1f} {r.unit}" if r.score is not None else "-",
            f"{r.vs_peers:.2f}x ({r.peers})" if r.vs_peers is not None else "-",
            f"{r.relative_speed:.2f}" if r.relative_speed is not None else "-",
            time.strftime("%m-%d %H:%M", time.localtime(r.probed_at)) if r.probed_at else "-",
            "SLOW" if r.slow else "")


def print_gpus(console, rows: list[GpuStatus], settings: ProbeSettings) -> None:
    """The GPU table on a rich console, and a line for each slow GPU."""
    from rich.table import Table

    if not rows:
        console.print("no GPU probed or measured yet (docs/slurm-plugins.md: the GPU probe prolog)")
        return
    table = Table(title=f"GPUs (slow: below {settings.slow_fraction:g}x the median of at least "
                        f"{settings.min_peers} peers)", box=None, header_style="bold")
    for col in GPU_COLUMNS:
        table.add_column(col, justify="right" if col in ("GPU", "SCORE", "VS PEERS", "PASSIVE") else "left")
    for r in rows:
        table.add_row(*gpu_cells(r))
    console.print(table)
    for r in rows:
        if r.kind == "cpu-stand-in":
            console.print("[yellow]cpu-stand-in: no CUDA on these nodes; scores are the CPU's "
                          "(GFLOP/s), not the GPUs'")
            break
