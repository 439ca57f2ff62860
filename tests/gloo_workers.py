"""Real torch.distributed (gloo) workers of the digits example, started without Slurm: the
environment the launcher would give them, a job directory, and the protocol files."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir

EXAMPLE = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "digits_mlp.py"


#: where :func:`free_port` picks: below the dev clusters' Slurm ports (16817 up), the jobs'
#: rank-0 stores (20000 up) and the kernel's ephemeral range (32768-60999), where every outgoing
#: connection and every ``bind(0)`` takes its port
FREE_PORTS = range(10000, 16500)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, drawn at random from :data:`FREE_PORTS`.

    Not ``bind(0)``: that port is from the ephemeral range, and a caller that binds it a while
    later (a case run minutes after its port was chosen) can find a connection of another test
    on it (EADDRINUSE, seen in CI)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(FREE_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {FREE_PORTS} after 200 draws")


def worker_env(jd: JobDir, rank: int, world: int, port: int, generation: int, local: int,
               accum: int, launch: int, **extra: str) -> dict[str, str]:
    """The environment the launcher gives worker ``rank`` of ``world`` on one node, then
    ``extra``."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
               HPCSCHED_JOB_DIR=str(jd.path), HPCSCHED_LAUNCH=str(launch),
               HPCSCHED_GENERATION=str(generation), HPCSCHED_NODES="1",
               HPCSCHED_LOCAL_BATCH_SIZE=str(local), HPCSCHED_ACCUMULATION_STEPS=str(accum),
               HPCSCHED_LR_SCALE="1.0")
    env.update(extra)   # may override the above (e.g. HPCSCHED_NODES)
    return env


def launch(jd: JobDir, world: int, generation: int, local: int, accum: int, launch: int,
            epochs: int, step_time: str = "0.01", **extra_env: str):
    """Start ``world`` workers of the digits example as launch ``launch`` of job ``jd``."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = worker_env(jd, rank, world, port, generation, local, accum, launch,
                         HPCSCHED_RECORD_SAMPLES="1", **extra_env)
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--epochs", str(epochs), "--min-step-time", step_time],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def wait_ack(jd, generation, state, procs, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        a = ctl.read_ack(jd.ack_path, jd.uid)
        if a is not None and a.generation == generation and a.state == state:
            return a
        if all(p.poll() is not None for p in procs):
            out = "".join(p.stdout.read() for p in procs)
            pytest.fail(f"workers exited before ack {generation}/{state}:\n{out[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"no ack {generation}/{state} within {timeout} s")


def write_control(jd, generation, action, world, local, accum, nodes=1):
    ctl.write_control(jd.control_path, ctl.Control(
        job_uid=jd.uid, generation=generation, action=action, nodes=nodes,
        workers_per_node=world // nodes,
        global_batch_size=world * local * accum, local_batch_size=local,
        accumulation_steps=accum, lr_scale=1.0, issued_at=time.time(), reason="test"))


def join(procs, timeout=120):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        assert p.returncode == 0, out[-3000:]
    return outs
