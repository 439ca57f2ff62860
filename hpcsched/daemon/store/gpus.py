"""The GPUs' measurements in the daemon's store: each rank's speed relative to its job's median
rank (``gpu_measurements``) and each GPU's probe at a job's start (``gpu_probes``,
slurm-plugins/prolog-gpu-probe). Times are UTC Unix seconds.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import String, cast, func, select

from hpcsched.daemon.store.rows import GpuProbeRow, insert_checked, to_row
from hpcsched.daemon.store.schema import GpuMeasurement, GpuProbe

_GPU_REQUIRED = ("job_id", "time", "node", "local_rank", "relative_speed")
_PROBE_REQUIRED = ("time", "node", "gpu_index", "kind", "score", "unit", "seconds")


class GpuMixin:
    """The GPU measurements' and probes' methods of :class:`~hpcsched.daemon.store.Store`
    (which provides ``_read`` and ``_write`` sessions)."""

    # -- GPU measurements --------------------------------------------------------------------

    def add_gpu_measurements(self, rows: Iterable[dict]) -> int:
        """Store per-rank speed measurements; returns how many. Each row: ``job_id``, ``time``
        (Unix s), ``node``, ``local_rank``, ``relative_speed`` (the rank's speed over its job's
        median rank; >1 = faster); optional ``gpu_index`` (str, e.g. from
        CUDA_VISIBLE_DEVICES), ``gpu_uuid``, ``app_class`` (""), ``steps`` (>= 1, default 1).
        The job must exist."""
        def prepare(r: dict) -> dict:
            r = {"gpu_index": None, "gpu_uuid": None, "app_class": "", "steps": 1, **r}
            if r["gpu_index"] is not None:
                r["gpu_index"] = str(r["gpu_index"])
            if r["steps"] < 1:
                raise ValueError(f"add_gpu_measurements: steps must be >= 1, got {r['steps']}")
            return r

        return insert_checked(self._write, "add_gpu_measurements", GpuMeasurement, rows,
                              _GPU_REQUIRED, prepare)

    def gpu_speeds(self, app_class: str | None = None, since: float | None = None
                   ) -> dict[tuple[str, str], float]:
        """Relative speed per GPU: ``(node, gpu_index)`` -> steps-weighted mean
        ``relative_speed`` (1.0 = the median rank of its job). Where no ``gpu_index`` was
        recorded the key is ``(node, str(local_rank))``. ``app_class`` restricts to one
        application class (None: all); ``since`` to measurements at or after that time."""
        G = GpuMeasurement
        gpu = func.coalesce(G.gpu_index, cast(G.local_rank, String))
        q = (select(G.node, gpu, func.sum(G.relative_speed * G.steps) / func.sum(G.steps))
             .group_by(G.node, gpu))
        if app_class is not None:
            q = q.where(G.app_class == app_class)
        if since is not None:
            q = q.where(G.time >= since)
        with self._read() as s:
            return {(node, str(g)): float(v) for node, g, v in s.execute(q)}

    # -- GPU probes --------------------------------------------------------------------------

    def add_gpu_probes(self, rows: Iterable[dict]) -> int:
        """Store GPU probes (docs/slurm-plugins.md); returns how many. Each row: ``time`` (Unix s),
        ``node``, ``gpu_index`` (str), ``kind`` (``cuda`` | ``cpu-stand-in``), ``score`` (> 0,
        in ``unit``), ``unit``, ``seconds``; optional ``gpu_uuid`` (None; "" counts as None),
        ``model`` (""), ``job_id`` (the Slurm job whose prolog probed; None).

        Raises:
            ValueError: an unknown or missing key, or a score that is not > 0.
        """
        def prepare(r: dict) -> dict:
            r = {"model": "", "job_id": None, **r, "gpu_index": str(r["gpu_index"]),
                 "gpu_uuid": r.get("gpu_uuid") or None}
            if not r["score"] > 0:
                raise ValueError(f"add_gpu_probes: score must be > 0, got {r['score']}")
            return r

        return insert_checked(self._write, "add_gpu_probes", GpuProbe, rows, _PROBE_REQUIRED,
                              prepare)

    def latest_gpu_probes(self) -> list[GpuProbeRow]:
        """The latest probe of every GPU ever probed, one row per GPU (its UUID, else its node
        and index: :attr:`GpuProbeRow.gpu_key`), ordered by node and index."""
        G = GpuProbe
        key = func.coalesce(G.gpu_uuid, G.node + ":" + G.gpu_index)
        rank = func.row_number().over(partition_by=key, order_by=(G.time.desc(), G.id.desc()))
        inner = select(G.id, rank.label("rank")).subquery()
        q = (select(G).join(inner, inner.c.id == G.id).where(inner.c.rank == 1)
             .order_by(G.node, func.length(G.gpu_index), G.gpu_index))
        with self._read() as s:
            return [to_row(GpuProbeRow, p) for p in s.scalars(q)]
