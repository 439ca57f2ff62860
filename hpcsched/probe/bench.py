"""The probe's benchmarks: a timed loop of square matrix multiplies, 2·n³ floating-point
operations each (the usual GEMM count), per GPU.

* :func:`cuda_scores`: torch on each CUDA device, half precision (tensor cores), TFLOP/s;
* :func:`cpu_scores`: the CPU stand-in for nodes without CUDA (the fake-GPU dev cluster): NumPy
  float32 on the CPU, GFLOP/s, once per Slurm GPU index. It measures the node's CPU, not a GPU:
  records carry ``kind = "cpu-stand-in"`` so nobody mistakes them for GPU speeds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpcsched.protocol.probes import KIND_CPU, KIND_CUDA, UNITS, GpuScore

CUDA_SIZE = 4096     # n of the n x n half-precision matrices (2 x 32 MiB + the result)
CPU_SIZE = 256       # n of the n x n float32 matrices of the stand-in
WARMUP = 3           # untimed multiplies first (kernel selection, clocks ramping up)


def cuda_present() -> bool:
    """Whether this node has an NVIDIA driver (cheap: no torch import)."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def timed_loop(step: Callable[[], None], sync: Callable[[], None], seconds: float,
               batch: int = 10) -> tuple[int, float]:
    """Run ``step`` in batches of ``batch`` (then ``sync``) until ``seconds`` have passed;
    returns (steps run, seconds elapsed). At least one batch runs."""
    for _ in range(WARMUP):
        step()
    sync()
    done, t0 = 0, time.perf_counter()
    while True:
        for _ in range(batch):
            step()
        sync()
        done += batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done, elapsed


def cpu_scores(indices: Sequence[str], seconds_each: float, size: int = CPU_SIZE) -> list[GpuScore]:
    """The CPU stand-in: GFLOP/s of a NumPy float32 ``size``-square matmul loop, once per index,
    on one BLAS thread (``OPENBLAS_NUM_THREADS=1`` unless set: steadier than a thread pool)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = []
    for idx in indices:
        n, elapsed = timed_loop(lambda: np.matmul(a, b), lambda: None, seconds_each)
        out.append(GpuScore(index=str(idx), score=2 * size**3 * n / elapsed / 1e9,
                            unit=UNITS[KIND_CPU], seconds=elapsed))
    return out


def _smi_uuids() -> dict[str, str]:
    """``{index: uuid}`` from ``nvidia-smi --query-gpu=index,uuid`` ({} when it fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    pairs = (line.split(",", 1) for line in out.splitlines() if "," in line)
    return {i.strip(): u.strip() for i, u in pairs}


def cuda_scores(indices: Sequence[str], seconds_each: float, size: int = CUDA_SIZE) -> list[GpuScore]:
    """TFLOP/s of a half-precision ``size``-square matmul loop on each CUDA device ``indices``.

    Slurm's GPU indices are the node's device numbers (gres.conf ``File=/dev/nvidiaN``), so the
    devices are enumerated in PCI bus order (nvidia-smi's order) with every GPU visible
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``CUDA_VISIBLE_DEVICES`` unset): set before torch
    initialises CUDA.

    Raises:
        RuntimeError: torch sees no CUDA device, or an index beyond the devices it sees.
    """
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    smi: dict[str, str] | None = None
    out = []
    for idx in indices:
        if int(idx) >= torch.cuda.device_count():
            raise RuntimeError(f"GPU {idx}: torch sees only {torch.cuda.device_count()} device(s)")
        dev = torch.device("cuda", int(idx))
        props = torch.cuda.get_device_properties(dev)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            uuid = f"GPU-{uuid}"
        else:
            smi = _smi_uuids() if smi is None else smi
            uuid = smi.get(str(idx), "")
        n, elapsed = _cuda_loop(torch, dev, size, seconds_each)
        out.append(GpuScore(index=str(idx), score=2 * size**3 * n / elapsed / 1e12,
                            unit=UNITS[KIND_CUDA], seconds=elapsed, uuid=uuid, model=props.name))
        torch.cuda.empty_cache()
    return out


def _cuda_loop(torch, dev, size: int, seconds: float) -> tuple[int, float]:
    a = torch.randn(size, size, device=dev, dtype=torch.float16)
    b = torch.randn(size, size, device=dev, dtype=torch.float16)
    return timed_loop(lambda: torch.matmul(a, b), lambda: torch.cuda.synchronize(dev), seconds)
