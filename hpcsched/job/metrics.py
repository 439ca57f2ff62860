"""Per-rank step records: ``metrics/launch-<L>-rank-<R>.jsonl`` in the job directory.

One JSON object per line, per optimizer step, appended (line-buffered) by every rank. The daemon
reads them (:mod:`hpcsched.daemon.ingest`) into the throughput profile and per-GPU
measurements; the tests read them to prove that every sample was processed exactly once. Fields:

* ``t``: Unix time (seconds) at the end of the step; ``launch``, ``restart``, ``generation``,
  ``step``, ``epoch``, ``rank``, ``pid`` (the worker's process id: a resize that restarts no
  worker keeps it);
* ``world_size``, ``nodes``, ``local_batch_size``, ``accumulation_steps``,
  ``global_batch_size``: the configuration in force;
* ``global_samples`` (all ranks) and ``samples`` (this rank) in the step; ``position`` and
  ``consumed``: the step took positions ``[position, position + consumed)`` of the epoch's
  permutation (the same on every rank: any one rank's records account for the whole job);
* ``step_time``: seconds from handing out the step to its end; ``compute_time``: seconds from
  handing it out to the gradient reduction (None without one);
* ``device``: ``{node, local_rank, gpu_index?, gpu_uuid?, gpu_name?}``;
* ``grad_sqr``, ``grad_var``: the smoothed gradient-noise statistics (None before the first);
* the values given to :meth:`hpcsched.elastic.ElasticJob.log` (e.g. ``loss``);
* ``indices``: this rank's sample indices, only with ``--hpcsched-record-samples``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def json_line(obj: dict) -> str:
    """``obj`` as one compact JSON line (no spaces, no newline)."""
    return json.dumps(obj, separators=(",", ":"))


def identify_device(torch, device, local_rank: int, environ: Mapping[str, str]) -> dict:
    """Who this rank is, physically: node (``SLURMD_NODENAME``, else the host name), local
    index, and where CUDA is present the GPU's index in ``CUDA_VISIBLE_DEVICES``, UUID and
    name."""
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    ident: dict[str, Any] = {"node": node, "local_rank": local_rank}
    visible = [v for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    if visible:
        ident["gpu_index"] = visible[local_rank % len(visible)]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ident["gpu_uuid"] = str(getattr(props, "uuid", ""))
        ident["gpu_name"] = props.name
    return ident


class StepMetrics:
    """One rank's step records and the step timing they carry.

    Args:
        path: the ``.jsonl`` file (its directory is created); None writes nothing.
        context: fields every record starts with (``launch``, ``restart``, ``rank``).
        device: :func:`identify_device`'s answer.
        record_samples: add each step's ``indices``.
    """

    def __init__(self, path: Path | None, context: dict, device: dict, record_samples: bool):
        self._fh = None
        if path is not None:
            path.parent.mkdir(exist_ok=True)
            self._fh = open(path, "a", buffering=1)  # noqa: SIM115 (open for the whole run)
        self._context, self._device, self._record_samples = context, device, record_samples
        self._started = time.perf_counter()
        self._compute_time: float | None = None
        self._logged: dict[str, float] = {}

    @classmethod
    def for_rank(cls, metrics_dir: Path | None, launch: int, restart: int, rank: int,
                 device: dict, record_samples: bool, extension: str = "") -> StepMetrics:
        """The records of ``rank`` in launch ``launch``: ``launch-<launch>-rank-<rank>.jsonl``
        in ``metrics_dir`` (None: no records); a worker of extension job ``extension`` writes
        ``launch-<launch>-ext-<extension>-rank-<task>.jsonl`` (its rank changes as it joins)."""
        name = f"launch-{launch}-ext-{extension}-rank-{rank}" if extension else \
            f"launch-{launch}-rank-{rank}"
        path = metrics_dir / f"{name}.jsonl" if metrics_dir else None
        return cls(path, {"launch": launch, "restart": restart, "rank": rank}, device,
                   record_samples)

    def set_rank(self, rank: int) -> None:
        """The process's rank changed (a re-formed group): later records carry ``rank``."""
        self._context["rank"] = rank

    def begin_step(self) -> None:
        """The step is handed to the training loop now."""
        self._started = time.perf_counter()
        self._compute_time = None

    def elapsed(self) -> float:
        """Seconds since the step was handed out."""
        return time.perf_counter() - self._started

    def compute_done(self) -> None:
        """The gradients are computed (the reduction starts)."""
        self._compute_time = time.perf_counter() - self._started

    def log(self, values: dict[str, float]) -> None:
        """Values for this step's record (later values of a name win)."""
        self._logged.update({k: float(v) for k, v in values.items()})

    def end_step(self, step, seconds: float, config: dict, noise: dict) -> None:
        """Write the record of ``step`` (a :class:`hpcsched.job.data.Step`) that took
        ``seconds`` (:meth:`elapsed`); ``config`` gives ``world_size``, ``nodes`` and
        ``global_batch_size`` in force, ``noise`` the ``grad_sqr`` / ``grad_var`` fields."""
        if self._fh is not None:
            rec = {
                "t": time.time(), "launch": self._context["launch"],
                "restart": self._context["restart"], "generation": step.generation,
                "step": step.step, "epoch": step.epoch, "rank": self._context["rank"],
                "pid": os.getpid(),
                "world_size": config["world_size"], "nodes": config["nodes"],
                "local_batch_size": step.local_batch_size,
                "accumulation_steps": step.accumulation_steps,
                "global_batch_size": config["global_batch_size"],
                "global_samples": step.global_samples, "samples": step.samples,
                "position": config.get("position"), "consumed": config.get("consumed"),
                "step_time": seconds, "compute_time": self._compute_time,
                "device": self._device, **noise, **self._logged,
            }
            if self._record_samples:
                rec["indices"] = step.indices
            self._fh.write(json_line(rec) + "\n")
        self._logged = {}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
