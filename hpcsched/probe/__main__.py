"""``python -m hpcsched.probe``: probe the job's GPUs on this node and write the record.

Reads the environment slurmd gives a prolog (Slurm's prolog_epilog guide and ``man slurm.conf``,
"Prolog and Epilog Scripts"): ``SLURM_JOB_ID``, ``SLURMD_NODENAME``, and the job's GPU indices on
this node from ``SLURM_JOB_GPUS`` (else ``GPU_DEVICE_ORDINAL``, else ``CUDA_VISIBLE_DEVICES``,
which in a prolog hold the node's own device numbers). Settings (docs/slurm-plugins.md):

* ``HPCSCHED_PROBE_DIR``: the spool directory (default :data:`DEFAULT_DIR`); created if missing;
* ``HPCSCHED_PROBE_SECONDS``: seconds of timed work in all, shared by the GPUs (default 4; each
  GPU gets at least 0.2 s);
* ``HPCSCHED_PROBE_BACKEND``: ``auto`` (CUDA when the node has an NVIDIA driver and torch sees
  it, else the CPU stand-in), ``cuda`` or ``cpu``.

Exit status: 0 when a record was written or the job has no GPU here; 2 for a bad environment;
1 when the benchmark failed (a record is still written, with no GPUs and the error, when it can
be). The prolog script ignores the status: a probe must never fail a job (docs/slurm-plugins.md).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpcsched.protocol.files import write_json_atomic
from hpcsched.protocol.probes import KIND_CPU, KIND_CUDA, ProbeRecord, file_name

log = logging.getLogger("hpcsched.probe")

DEFAULT_DIR = "/var/lib/hpcsched/gpu-probes"
DEFAULT_SECONDS = 4.0
MIN_SECONDS_EACH = 0.2
_GPU_VARS = ("SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES")


class ProbeEnvError(ValueError):
    """The prolog's environment lacks what the probe needs (message: which variable)."""


def gpu_indices(env: Mapping[str, str]) -> list[str]:
    """The job's GPU indices on this node, from the first of :data:`_GPU_VARS` that is set:
    ``"0,2"`` -> ``["0", "2"]``, ``"0-2"`` -> ``["0", "1", "2"]``; [] when none is set.

    Raises:
        ProbeEnvError: an entry that is neither an index nor a range (e.g. a UUID or MIG name).
    """
    for var in _GPU_VARS:
        text = env.get(var, "").strip()
        if not text or text == "NoDevFiles":
            continue
        out: list[str] = []
        for part in text.split(","):
            m = re.fullmatch(r"(\d{1,6})(?:-(\d{1,6}))?", part.strip())
            if m is None:
                raise ProbeEnvError(f"{var}={text!r}: not a list of GPU indices")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            out += [str(i) for i in range(lo, hi + 1)]
        return sorted(set(out), key=int)
    return []


def _seconds(env: Mapping[str, str]) -> float:
    text = env.get("HPCSCHED_PROBE_SECONDS", "") or str(DEFAULT_SECONDS)
    try:
        v = float(text)
    except ValueError:
        raise ProbeEnvError(f"HPCSCHED_PROBE_SECONDS={text!r}: not a number") from None
    if not 0 < v <= 600:
        raise ProbeEnvError(f"HPCSCHED_PROBE_SECONDS={text!r}: must be in (0, 600]")
    return v


def choose_backend(env: Mapping[str, str]) -> str:
    """``cuda`` or ``cpu`` for ``HPCSCHED_PROBE_BACKEND`` (``auto``: cuda where a driver is)."""
    from hpcsched.probe.bench import cuda_present

    backend = env.get("HPCSCHED_PROBE_BACKEND", "auto") or "auto"
    if backend not in ("auto", "cuda", "cpu"):
        raise ProbeEnvError(f"HPCSCHED_PROBE_BACKEND={backend!r}: expected auto|cuda|cpu")
    if backend == "auto":
        return "cuda" if cuda_present() else "cpu"
    return backend


def probe(env: Mapping[str, str]) -> tuple[ProbeRecord | None, Path | None]:
    """Benchmark the job's GPUs here and write the record; returns it and its path, or
    ``(None, None)`` when the job has no GPU on this node.

    Raises:
        ProbeEnvError: no ``SLURM_JOB_ID`` / ``SLURMD_NODENAME``, or a bad setting.
    """
    job_id, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job_id or not node:
        raise ProbeEnvError("SLURM_JOB_ID and SLURMD_NODENAME must be set (run from a Slurm prolog)")
    indices = gpu_indices(env)
    if not indices:
        return None, None
    each = max(MIN_SECONDS_EACH, _seconds(env) / len(indices))
    backend = choose_backend(env)
    spool = Path(env.get("HPCSCHED_PROBE_DIR") or DEFAULT_DIR)
    spool.mkdir(parents=True, exist_ok=True)
    from hpcsched.probe import bench

    errors: list[str] = []
    try:
        scores = (bench.cuda_scores(indices, each) if backend == "cuda"
                  else bench.cpu_scores(indices, each))
    except Exception as exc:  # any benchmark failure is reported in the record
        scores, errors = [], [f"{type(exc).__name__}: {exc}"[:500]]
    record = ProbeRecord(node=node, job_id=job_id, time=time.time(),
                         kind=KIND_CUDA if backend == "cuda" else KIND_CPU,
                         gpus=tuple(scores), errors=tuple(errors))
    path = spool / file_name(node, job_id)
    write_json_atomic(path, record.to_json())
    return record, path


def main(env: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="hpcsched-probe: %(message)s")
    env = os.environ if env is None else env
    try:
        record, path = probe(env)
    except ProbeEnvError as exc:
        log.error("%s", exc)
        return 2
    if record is None:
        log.info("job %s has no GPU on this node; nothing probed", env.get("SLURM_JOB_ID"))
        return 0
    for e in record.errors:
        log.error("job %s on %s: %s", record.job_id, record.node, e)
    summary = ", ".join(f"GPU {g.index} {g.score:.1f} {g.unit}" for g in record.gpus)
    log.info("job %s on %s (%s): %s -> %s", record.job_id, record.node, record.kind,
             summary or "no score", path)
    return 1 if record.errors else 0


if __name__ == "__main__":
    sys.exit(main())
