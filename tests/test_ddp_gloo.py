"""ElasticDDP with real torch.distributed (gloo) processes: the same gradient and the same
gradient-noise estimate as the explicit reduce_gradients path, on uneven sample counts, with a
rank that has no sample in a step, and across a re-formed process group; with DDP's own
all-reduce (the default) and with ElasticDDP's communication hook (extension members)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import session_lock
from tests.gloo_workers import free_port

WORKER = Path(__file__).resolve().parent / "ddp_check_worker.py"
BATCH = Path(__file__).resolve().parent / "ddp_check_batch_worker.py"
LOST_PEER = Path(__file__).resolve().parent / "ddp_lost_peer_worker.py"
ROOT = WORKER.parent.parent

# (n, local, accum, reform_at, padded) of test_ddp_matches_the_explicit_reduction
REDUCTION_CASES = [
    (41, 3, 2, -1, 0),   # last step of each epoch: 5 samples, 3 on rank 0 and 2 on rank 1
    (37, 3, 2, -1, 2),   # last step: 1 sample; rank 1 runs a zero-weight padding micro-batch
    (46, 3, 2, -1, 0),   # last step: 10 samples, micro-batches of 3 then 2 on each rank
    (41, 6, 1, 4, 0),    # no accumulation; the group is re-formed at step 4: DDP wraps again
]
MODES = ["builtin", "hooked"]


def _run(world: int, n: int, epochs: int, reform_at: int, local: int, accum: int,
         script: Path = WORKER, *extra: str) -> list[dict]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                   HPCSCHED_LOCAL_BATCH_SIZE=str(local), HPCSCHED_ACCUMULATION_STEPS=str(accum),
                   PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, str(script), str(n), str(epochs),
                                       str(reform_at), *extra], env=env,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
        lines = out.strip().splitlines()
        outs.append(json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None)
    return outs


def _check_cases() -> list[dict]:
    """Every case of ddp_check_worker.py that the tests below check: (n, epochs, reform_at,
    local, accum, mode[, noise_every])."""
    cases = [(n, 2, reform_at, local, accum, mode)
             for mode in MODES for n, local, accum, reform_at, _ in REDUCTION_CASES]
    cases += [(41, 2, -1, 3, 2, mode, 3) for mode in MODES]
    return [{"key": repr(c), "local": c[3], "accum": c[4],
             "argv": [str(c[0]), str(c[1]), str(c[2]), *map(str, c[5:])]} for c in cases]


@pytest.fixture(scope="module")
def ddp_checks(tmp_path_factory) -> dict[str, list]:
    """All cases of ddp_check_worker.py, run by one pair of gloo ranks one after the other
    (ddp_check_batch_worker.py: each case as in a fresh process, with a TCPStore of its own),
    instead of a pair of processes per case: each process imports torch (and torch._dynamo)
    once, about 3 s of the 7 s a case took. ``{key: [rank 0's line, rank 1's line]}``; a case
    the ranks did not reach, or that raised, has ``{"error": ...}`` in place of a line.

    Under pytest-xdist, once per session: the first worker to get here runs them (the others
    wait on a lock) and leaves the lines in the session's shared temporary directory."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _run_checks()
    with session_lock(tmp_path_factory, "ddp_checks") as root:
        done = root / "ddp_checks.json"
        if not done.is_file():
            done.write_text(json.dumps(_run_checks()))
        return json.loads(done.read_text())


def _run_checks() -> dict[str, list]:
    cases = _check_cases()
    ports: set[int] = set()
    while len(ports) < len(cases):   # one port per case, none used twice
        ports.add(free_port())
    for c, port in zip(cases, sorted(ports)):
        c["port"] = port
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, str(BATCH), json.dumps(cases)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results: dict[str, list] = {c["key"]: [None, None] for c in cases}
    tails = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=120 * len(cases))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        tails.append(f"rank {rank}, exit {p.returncode}:\n{out[-3000:]}")
        for line in out.splitlines():
            if line.startswith('{"key"'):
                d = json.loads(line)
                results[d["key"]][rank] = d.get("out", {"error": d.get("error")})
    for key, pair in results.items():
        for rank in range(2):
            if pair[rank] is None:
                pair[rank] = {"error": "case not reached\n" + "\n".join(tails)}
    return results


def _outs(ddp_checks, n, epochs, reform_at, local, accum, *extra) -> list[dict]:
    outs = ddp_checks[repr((n, epochs, reform_at, local, accum, *extra))]
    for o in outs:
        assert "error" not in o, o["error"]
    return outs


@pytest.mark.parametrize("n, local, accum, reform_at, padded", REDUCTION_CASES)
@pytest.mark.parametrize("mode", MODES)
def test_ddp_matches_the_explicit_reduction(n, local, accum, reform_at, padded, mode,
                                            ddp_checks):
    outs = _outs(ddp_checks, n, 2, reform_at, local, accum, mode)
    for o in outs:
        assert o["grad_diff"] < 1e-12, o
        assert o["wraps"] == (2 if reform_at >= 0 else 1)
        g, ref = o["gns"], o["gns_explicit"]
        assert g is not None and ref is not None
        assert g == pytest.approx(ref, rel=1e-9)
    assert outs[1]["padded_steps"] == padded
    assert outs[0]["steps"] == outs[1]["steps"]


@pytest.mark.parametrize("mode", MODES)
def test_steps_not_measured_keep_the_exact_gradient(mode, ddp_checks):
    """noise_every 3: two steps in three run without the noise hooks (DDP's own all-reduce:
    no hook at all), on full steps with accumulation and on short ones."""
    outs = _outs(ddp_checks, 41, 2, -1, 3, 2, mode, 3)
    for o in outs:
        assert o["grad_diff"] < 1e-12, o
        assert o["gns"] is not None


def test_a_lost_peer_voids_the_step_and_is_handed_to_the_job():
    """Rank 1 dies at step 3: rank 0's backward still ends (the hook catches the failed
    all-reduce), the job is told (its _peer_lost), the step is voided and has no gradient."""
    first, second = _run(2, 0, 0, 0, 2, 1, script=LOST_PEER)
    assert second is None                                   # rank 1 died printing nothing
    steps = first["steps"]
    assert [s["void"] for s in steps] == [False, False, False, True]
    assert [len(s["lost"]) for s in steps] == [0, 0, 0, 1]
    assert [s["grads"] for s in steps] == [True, True, True, False]
    assert first["gns"] is not None                         # measured before the loss
