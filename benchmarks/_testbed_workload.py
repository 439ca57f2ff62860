"""The testbed's workload: a systematic sample of one of Pollux's workloads, sized for a small
cluster (benchmarks/testbed.py).

Pollux's workloads (Qiao et al., OSDI'21 §5.1; ``hpcsched/data/pollux/workloads/``) are 160 jobs
over 8 h for 16 nodes x 4 GPUs. The testbed has fewer GPUs (the dev cluster: 4 x 4), so it takes
every ``every``-th job (``every = 64 / cluster GPUs``: the same arrivals per GPU, hence the same
load) starting at ``offset`` -- a systematic sample keeps the applications in their proportions
and the arrivals spread over the 8 h -- and divides each job's GPU request by the same factor
(rounded up, at least 1), with the batch size Pollux's generator would have tuned for that GPU
count (:func:`hpcsched.sim.tuned.tuned_batch_size`). Arrival times are kept; ``hpcsched replay
--scale`` shrinks them together with the work.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from hpcsched.sim import WorkloadJob
from hpcsched.sim.tuned import tuned_batch_size
from hpcsched.sim.workload import load_workload

#: GPUs of the cluster Pollux's workloads were made for (16 nodes x 4 GPUs).
POLLUX_CLUSTER_GPUS = 64


def sample_workload(number: int, offset: int, cluster_gpus: int) -> list[WorkloadJob]:
    """Every ``64 / cluster_gpus``-th job of Pollux workload ``number`` (load 1.0) from
    ``offset``, each asking for ``ceil(gpus x cluster_gpus / 64)`` GPUs at a tuned batch size.

    Raises:
        ValueError: ``cluster_gpus`` does not divide 64, or ``offset`` is not in
            ``[0, 64 / cluster_gpus)``.
    """
    if cluster_gpus < 1 or POLLUX_CLUSTER_GPUS % cluster_gpus:
        raise ValueError(f"the cluster's {cluster_gpus} GPUs must divide {POLLUX_CLUSTER_GPUS}")
    every = POLLUX_CLUSTER_GPUS // cluster_gpus
    if not 0 <= offset < every:
        raise ValueError(f"offset must be in [0, {every})")
    _, jobs = load_workload(f"pollux:{number}")
    out = []
    for job in jobs[offset::every]:
        gpus = max(1, -(-job.gpus // every))
        out.append(dataclasses.replace(job, gpus=gpus,
                                       batch_size=tuned_batch_size(job.application, gpus)))
    return out


def write_pollux_csv(jobs: Sequence[WorkloadJob], path: Path) -> Path:
    """Write ``jobs`` in the Pollux format (``name,time,application,num_replicas,batch_size``)
    that ``hpcsched simulate`` and ``hpcsched replay`` read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "time", "application", "num_replicas", "batch_size"])
        for j in jobs:
            w.writerow([j.name, f"{j.submit_time:g}", j.application, j.gpus, j.batch_size])
    return path
