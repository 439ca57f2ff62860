"""The workers' collectives: the process group of each generation, the gradient all-reduce,
and the in-place shrink that re-forms the group without restarting the workers that stay.

torch is imported by the caller (:class:`hpcsched.elastic.ElasticJob`) and passed in, so that
importing this module (the launcher does, indirectly) costs nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

log = logging.getLogger(__name__)

#: seconds rank 0 waits for the leaving ranks' markers in an in-place shrink
LEAVE_TIMEOUT = 30.0


def select_device(torch, local_rank: int):
    """The device this rank trains on: GPU ``local_rank`` (modulo the visible GPUs, made the
    current CUDA device) where CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def state_of_most_advanced(dist, world_size: int, step: int,
                           state: Callable[[], object]) -> tuple[int, list[int], object] | None:
    """Collective: bring the ranks of a group to the training state of the one that has done
    the most optimizer steps.

    ``step`` is this rank's count of steps done; ``state()`` gives its state (called on the
    source rank only). Returns None when every rank has done the same number of steps (nothing
    travels), else ``(src, steps, state)``: the lowest rank with the most steps, every rank's
    count, and ``src``'s state (on every rank; ``src``'s own included).

    Why: when a peer is lost, each rank sees the loss in its own collective; a ring all-reduce
    can complete on some ranks and fail on others, so survivors can be a step apart. torchft
    recovers the same way, from a replica at the quorum's highest step
    (``torchft.manager.Manager``, "max_step").

    Raises:
        RuntimeError: the collective failed (another peer lost).
    """
    steps = [0] * world_size
    dist.all_gather_object(steps, int(step))
    if min(steps) == max(steps):
        return None
    src = steps.index(max(steps))
    box = [state() if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return src, steps, box[0]


def allreduce_flat(torch, dist, params: list, local_stats: Callable | None = None,
                   stats_size: int = 0):
    """Sum the gradients of ``params`` over all ranks in one all-reduce and write them back
    (``p.grad``; a missing gradient counts as zero).

    ``local_stats(flat)``, given this rank's flattened gradient before the reduction, returns
    ``stats_size`` numbers (a 1-d tensor) to be summed over ranks as well. When every gradient
    is float32, or every one float64, they travel at the end of the same flat buffer (no extra
    communication); otherwise (low precision) in float32, in a second, asynchronous all-reduce
    beside the gradients'.

    Returns:
        ``(flat, stats)``: the reduced gradient as one 1-d tensor (the parameters' order), and
        the summed statistics (None without ``local_stats``).
    """
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    stats = work = None
    dtype = parts[0].dtype if parts else None
    if local_stats is not None and dtype in (torch.float32, torch.float64) and \
            all(t.dtype == dtype for t in parts):
        buf = torch.cat(parts + [parts[0].new_zeros(stats_size)])  # piggyback
        size = buf.numel() - stats_size
        buf[size:] = local_stats(buf[:size])
        dist.all_reduce(buf)
        flat, stats = buf[:size], buf[size:]
    else:
        flat = torch.cat(parts)
        if local_stats is not None:
            stats = local_stats(flat).to(torch.float32)
            work = dist.all_reduce(stats, async_op=True)
        dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    if work is not None:
        work.wait()
    return flat, stats


class ProcessGroup:
    """torch.distributed for one launch of the workers (world size > 1).

    One TCPStore for the life of the launch (rank 0 hosts it at ``MASTER_ADDR:MASTER_PORT``);
    each process group formed on it gets its own key prefix (``hpcsched/g<generation>/``), so
    the survivors of an in-place shrink can form a smaller group without a new port. When the
    script initialised torch.distributed itself, that group is used as it is.

    Args:
        dist: ``torch.distributed``.
        rank, world_size: this process's place (torch.distributed's ``RANK``, ``WORLD_SIZE``).
        generation: the control generation the group is formed for.
        addr, port: rank 0's TCPStore.
        backend: ``nccl`` or ``gloo``.
        timeout: seconds to wait for all ranks to join (and for any collective).
        device: where collectives of small host values run (the rank's GPU under NCCL, which
            reduces only CUDA tensors; the CPU under gloo).
    """

    def __init__(self, dist, rank: int, world_size: int, generation: int, addr: str, port: int,
                 backend: str, timeout: float, device, joining: bool = False):
        self.dist = dist
        self.rank, self.world_size = rank, world_size
        self._backend, self._timeout = backend, timedelta(seconds=timeout)
        self.device = device
        self._store = None
        if joining:  # an extension's worker: the running job's store, no group until invited
            self._store = dist.TCPStore(addr, port, is_master=False, timeout=self._timeout)
        elif not dist.is_initialized():
            self._store = dist.TCPStore(addr, port, is_master=rank == 0, timeout=self._timeout,
                                        wait_for_workers=False)
            self.form(generation, world_size)

    @property
    def store(self):
        """The launch's TCPStore (None when the script formed its own group)."""
        return self._store

    def reform(self, form: int, rank: int, world_size: int, timeout: float) -> None:
        """Leave the current group (if any) and form group number ``form`` (store prefix
        ``hpcsched/f<form>/``) as ``rank`` of ``world_size``; collectives then give up on a
        peer after ``timeout`` seconds."""
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
        self.rank, self.world_size = rank, world_size
        self.dist.init_process_group(
            self._backend, store=self.dist.PrefixStore(f"hpcsched/f{form}/", self._store),
            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))

    @classmethod
    def join(cls, torch, rank: int, world_size: int, generation: int, addr: str, port: int,
             backend: str | None, timeout: float, device, always: bool = False,
             joining: bool = False) -> ProcessGroup | None:
        """The group of a launch with ``world_size`` ranks (None for a single rank unless
        ``always``: a job that may grow by extensions needs the store from the start):
        ``backend`` defaults to ``nccl`` where CUDA is present, else ``gloo``; ``device`` is the
        rank's. ``joining``: connect to a running job's store and form nothing yet."""
        if world_size <= 1 and not (always or joining):
            return None
        import torch.distributed as dist

        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist, rank, world_size, generation, addr, port, backend, timeout,
                   device if backend == "nccl" else torch.device("cpu"), joining=joining)

    def form(self, generation: int, world_size: int) -> None:
        """Join the process group of ``generation`` with ``world_size`` ranks."""
        self.world_size = world_size
        self.dist.init_process_group(
            self._backend, store=self.dist.PrefixStore(f"hpcsched/g{generation}/", self._store),
            rank=self.rank, world_size=world_size, timeout=self._timeout,
        )

    def broadcast_ints(self, torch, values: list[int]) -> list[int]:
        """Rank 0's ``values`` (int64) on every rank."""
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        self.dist.broadcast(t, src=0)
        return t.tolist()

    def barrier(self) -> None:
        self.dist.barrier()

    def leave(self) -> None:
        """All ranks leave together: a rank that tears gloo down while a peer is still in a
        collective can abort that peer at exit."""
        if self.dist.is_initialized():
            self.dist.barrier()
            self.dist.destroy_process_group()

    def shrink_in_place(self, generation: int, new_world: int, left_dir: Path,
                        before_exit: Callable[[], None],
                        release: Callable[[], str | None]) -> str | None:
        """Keep ranks ``< new_world``; the others leave (cf. Amoeba/EDL, Wu et al.,
        arXiv:1909.11985).

        A leaving rank calls ``before_exit``, leaves a marker ``g<generation>-rank-<r>`` in
        ``left_dir`` and exits with status 0 (``os._exit``: this call never returns there).
        The ranks that stay leave the old group; rank 0 waits for every marker (at most
        :data:`LEAVE_TIMEOUT` s), then calls ``release`` (which gives the nodes back to
        Slurm: the leavers must be gone first, since Slurm SIGKILLs tasks on released nodes);
        then they form the group of ``generation`` with ``new_world`` ranks.

        Returns:
            ``release``'s error on rank 0 (None: released, or another rank).
        """
        if self.rank >= new_world:
            _leave(left_dir, f"g{generation}-rank-{self.rank}", before_exit)
        self.dist.destroy_process_group()
        error = None
        if self.rank == 0:
            _wait_for_markers(left_dir, {f"g{generation}-rank-{r}"
                                         for r in range(new_world, self.world_size)})
            error = release()
        self.form(generation, new_world)
        return error


def leave_now(status: int = 0) -> None:
    """End this worker at once (``os._exit``: interpreter teardown with torch loaded takes
    seconds, and a leaving worker must not run the script's code after the loop)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _leave(left_dir: Path, marker: str, before_exit: Callable[[], None]) -> None:
    left_dir.mkdir(exist_ok=True)
    before_exit()
    (left_dir / marker).touch()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait_for_markers(left_dir: Path, expected: set[str]) -> None:
    deadline = time.monotonic() + LEAVE_TIMEOUT
    while time.monotonic() < deadline:
        if left_dir.is_dir() and expected <= {p.name for p in left_dir.iterdir()}:
            break
        time.sleep(0.01)
    time.sleep(0.1)  # let the leavers' processes finish exiting
