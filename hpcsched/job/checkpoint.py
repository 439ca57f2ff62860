"""Checkpoints of an elastic job: what they hold, how they are written and found, and how a
run continues from one.

A checkpoint (format :data:`CHECKPOINT_FORMAT`, one ``torch.save`` file) is a dict::

    format, time, generation, world_size,
    batch  {local_batch_size, accumulation_steps, global_batch_size, lr_scale},
    data   {epoch, position, step, samples_processed, seed, dataset_size},
    model, optimizer, scheduler   (their state_dict(), or None), extra (a dict),
    grad_noise (GradientNoiseEstimator.state_dict()),
    rng    {torch, numpy, python}

Rank 0 writes ``step-<N>.pt`` atomically (temporary file, fsync, rename), then the ``latest.json``
pointer, and keeps the last two. Everything loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import CHECKPOINTS_DIR

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "hpcsched.checkpoint/1"
LATEST = "latest.json"
KEEP = 2  # checkpoint files kept


@dataclass
class Registered:
    """The script's objects a checkpoint holds (:meth:`hpcsched.elastic.ElasticJob.register`)."""

    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    extra: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        """The checkpoint's ``model``, ``optimizer``, ``scheduler`` and ``extra`` entries."""
        out = {name: obj.state_dict() if obj is not None else None
               for name, obj in (("model", self.model), ("optimizer", self.optimizer),
                                 ("scheduler", self.scheduler))}
        out["extra"] = self.extra
        return out

    def load_state_dict(self, ck: dict) -> None:
        """Restore each registered object that the checkpoint holds; ``extra`` is updated."""
        for name, obj in (("model", self.model), ("optimizer", self.optimizer),
                          ("scheduler", self.scheduler)):
            if obj is not None and ck[name] is not None:
                obj.load_state_dict(ck[name])
        self.extra.update(ck.get("extra") or {})


def training_state(cfg, data, registered: Registered, grad_noise) -> dict:
    """The checkpoint's entries from each part of a job (``format``, ``time`` and ``rng`` are
    added by :meth:`Checkpointer.save`): ``cfg`` the configuration in force
    (:class:`hpcsched.job.boundary.InForce`), ``data`` the
    :class:`~hpcsched.job.data.DataPosition`, ``grad_noise`` the
    :class:`~hpcsched.job.gradient_noise.GradientNoiseEstimator`."""
    b = cfg.batch
    return {"generation": cfg.generation, "world_size": cfg.world_size,
            "batch": {"local_batch_size": b.local_batch_size,
                      "accumulation_steps": b.accumulation_steps,
                      "global_batch_size": b.global_batch_size, "lr_scale": cfg.lr_scale},
            "data": data.state_dict(), **registered.state_dict(),
            "grad_noise": grad_noise.state_dict()}


def rng_state(torch) -> dict:
    """The torch, numpy and python generators' states (``weights_only``-loadable)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": random.getstate(),
    }


def set_rng_state(torch, rng: dict) -> None:
    """Inverse of :func:`rng_state`."""
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    random.setstate(_tuples(rng["python"]))


def _tuples(x):
    """torch.load gives lists back where random.getstate() had tuples."""
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    return x


#: seconds a checkpoint is assumed to take until the job has measured one
ASSUMED_COST_S = 10.0
#: bounds of the Young/Daly interval, seconds: no more often than every minute, at least every
#: 6 hours
MIN_INTERVAL_S, MAX_INTERVAL_S = 60.0, 6 * 3600.0


def young_daly_interval(cost: float, mtbf: float) -> float:
    """The checkpoint interval that minimises the expected time lost to checkpoints and to
    failures, ``sqrt(2 x cost x mtbf)`` seconds (Young, "A first order approximation to the
    optimum checkpoint interval", CACM 17(9), 1974; Daly, "A higher order estimate of the
    optimum checkpoint interval for restart dumps", FGCS 22(3), 2006, eq. 37's first-order
    term), within ``[MIN_INTERVAL_S, MAX_INTERVAL_S]``. Its overhead is about
    ``cost / interval = sqrt(cost / (2 x mtbf))`` of the training time.

    Args:
        cost: seconds one checkpoint takes (> 0). mtbf: the job's mean time between failures,
            seconds (> 0): its nodes' MTBF over its node count.
    """
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, math.sqrt(2.0 * cost * mtbf)))


class Checkpointer:
    """Writes and finds one job's checkpoints, and says when the job's own are due.

    Args:
        directory: where checkpoints go (None: no checkpoints).
        interval: seconds between the job's own checkpoints (> 0: fixed); 0: by ``mtbf``.
        mtbf: with ``interval`` 0, the job's mean time between failures (seconds): its own
            checkpoints follow :func:`young_daly_interval` of their measured cost (an
            exponential average of the last ones; :data:`ASSUMED_COST_S` until one is
            measured); 0 as well: only when asked (hpcsched's resizes, Slurm's signal).
    """

    def __init__(self, directory: Path | None, interval: float = 0.0, mtbf: float = 0.0):
        self.directory = directory
        self.interval = interval
        self.mtbf = mtbf
        self.cost: float | None = None   # seconds per checkpoint, measured
        self._last = time.monotonic()

    @classmethod
    def for_job(cls, directory: str, job_dir: Path | None, interval: float,
                mtbf: float = 0.0) -> Checkpointer:
        """``directory`` if given, else the job directory's ``checkpoints/`` (none without a
        job directory)."""
        if directory:
            return cls(Path(directory), interval, mtbf)
        return cls(job_dir / CHECKPOINTS_DIR if job_dir is not None else None, interval, mtbf)

    @property
    def period(self) -> float:
        """Seconds between the job's own checkpoints now; 0: none of its own."""
        if self.interval > 0:
            return self.interval
        if self.mtbf > 0 and self.directory is not None:
            return young_daly_interval(self.cost or ASSUMED_COST_S, self.mtbf)
        return 0.0

    @property
    def due(self) -> bool:
        """The period has passed since the last checkpoint."""
        period = self.period
        return period > 0 and time.monotonic() - self._last >= period

    def written(self, seconds: float | None = None) -> None:
        """A checkpoint was just taken (restarts the period), in ``seconds`` where measured."""
        self._last = time.monotonic()
        if seconds is not None and seconds >= 0:
            self.cost = seconds if self.cost is None else 0.5 * self.cost + 0.5 * seconds

    def save(self, torch, state: dict, step: int) -> Path:
        """Write ``state`` (the entries of the format above except ``format``, ``time`` and
        ``rng``, which are added here) as ``step-<step>.pt``; returns its path."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"step-{step:09d}.pt"
        tmp = d / f".{final.name}.{os.getpid()}.tmp"
        full = {"format": CHECKPOINT_FORMAT, "time": time.time(), **state, "rng": rng_state(torch)}
        with open(tmp, "wb") as fh:
            torch.save(full, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        ctl.write_json_atomic(d / LATEST, {"path": final.name, "step": step, "time": time.time()})
        for old in sorted(d.glob("step-*.pt"))[:-KEEP]:
            old.unlink(missing_ok=True)
        return final

    def latest_path(self) -> Path | None:
        """The newest checkpoint's path per ``latest.json`` (None: none, or an unreadable
        pointer, which is logged)."""
        if self.directory is None:
            return None
        try:
            meta = ctl.load_json_object(self.directory / LATEST)
        except ctl.ProtocolError as exc:
            log.warning("%s", exc)
            return None
        if not meta or "path" not in meta:
            return None
        return self.directory / meta["path"]

    def load(self, torch) -> tuple[Path, dict] | None:
        """The newest checkpoint, on the CPU; None when there is none.

        Raises:
            ValueError: the file is not an hpcsched checkpoint.
        """
        path = self.latest_path()
        if path is None or not path.exists():
            return None
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if ck.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: not an hpcsched checkpoint")
        return path, ck
