"""hpcsched.job.collective's recovery collective on a real gloo group of 3 processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from tests.gloo_workers import free_port

torch = pytest.importorskip("torch")


def _rank(rank: int, world: int, port: int, steps: list[int], out) -> None:
    import torch.distributed as dist

    from hpcsched.job.collective import state_of_most_advanced

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        got = state_of_most_advanced(dist, world, steps[rank],
                                     lambda: {"step": steps[rank], "from": rank})
        out.put((rank, got))
    finally:
        dist.destroy_process_group()


def _run(steps: list[int]) -> dict[int, object]:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, len(steps), port, steps, out))
             for r in range(len(steps))]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return got


def test_survivors_a_step_apart_all_take_the_most_advanced_state():
    got = _run([5, 6, 6])
    # rank 1 is the lowest rank at 6 steps: its state reaches every rank, itself included
    assert got == {r: (1, [5, 6, 6], {"step": 6, "from": 1}) for r in range(3)}


def test_survivors_in_step_exchange_nothing_more():
    assert _run([7, 7, 7]) == {0: None, 1: None, 2: None}
