"""The environment contract between the launcher and the training processes, defined once.

The launcher (:mod:`hpcsched.job.launcher`) starts every worker of a launch with the same
:class:`LaunchEnv` in its environment (``LaunchEnv(...).to_env()``); the worker shim
(:mod:`hpcsched.job.worker`) and the training API (:class:`hpcsched.elastic.ElasticJob`) read it
back with :meth:`LaunchEnv.from_env`. What a process learns about itself (its rank, set by the
worker shim or by ``torchrun``; Slurm's job id and restart count) is :class:`ProcessEnv`.

The variable names are part of the public interface (running jobs and their scripts read
them), so they never change; each field names its variable below. Every variable is optional
when read: a script run under plain ``python`` or ``torchrun`` sees the defaults, and
``ElasticJob`` then runs standalone. The same pattern as AdaptDL's ``adaptdl/env.py`` and
submitit's ``JobEnvironment._env`` table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# the value types a variable can carry, each with its parser and writer
_PARSE: dict[str, Callable[[str, Any], Any]] = {
    "str": lambda v, default: v,
    "int": lambda v, default: int(v),
    "float": lambda v, default: float(v),
    # a flag leaves its default only on the opposite literal: "0" turns a default-on flag off,
    # "1" turns a default-off flag on; anything else keeps the default
    "bool": lambda v, default: (not default) if v == ("0" if default else "1") else default,
}
_WRITE: dict[str, Callable[[Any], str]] = {
    "str": str, "int": str, "float": repr, "bool": lambda v: "1" if v else "0"}


def _var(name: str, kind: str, default):
    return field(default=default, metadata={"env": name, "kind": kind})


def _read(cls, environ: Mapping[str, str]):
    """An instance of ``cls`` from ``environ``; an unset or empty variable gives the default."""
    kwargs = {}
    for f in fields(cls):
        value = environ.get(f.metadata["env"])
        if value not in (None, ""):
            kwargs[f.name] = _PARSE[f.metadata["kind"]](value, f.default)
    return cls(**kwargs)


def variables(cls) -> dict[str, str]:
    """``{field name: environment variable}`` for :class:`LaunchEnv` or :class:`ProcessEnv`."""
    return {f.name: f.metadata["env"] for f in fields(cls)}


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher tells every worker of one launch (``HPCSCHED_*``, ``MASTER_*``).

    Attributes:
        job_dir: the job directory (``HPCSCHED_JOB_DIR``); "" when not run by hpcsched.
        launch: 1-based count of the launcher's ``srun`` launches in this Slurm run
            (``HPCSCHED_LAUNCH``); names the metrics files.
        generation: the control generation in force at launch (``HPCSCHED_GENERATION``).
        nodes: nodes of the launch (``HPCSCHED_NODES``).
        workers_per_node: workers (GPU slots) per node (``HPCSCHED_WORKERS_PER_NODE``).
        world_size: workers of the launch, ``nodes * workers_per_node``
            (``HPCSCHED_WORLD_SIZE``).
        local_batch_size, accumulation_steps, global_batch_size: the batch configuration, in
            samples (``HPCSCHED_LOCAL_BATCH_SIZE``, ``HPCSCHED_ACCUMULATION_STEPS``,
            ``HPCSCHED_GLOBAL_BATCH_SIZE``; see :class:`hpcsched.protocol.batching.BatchConfig`).
            Without a local batch size the script's own ``batch_size`` is used.
        lr_scale: factor on the base learning rate (``HPCSCHED_LR_SCALE``).
        checkpoint_dir: where checkpoints go (``HPCSCHED_CHECKPOINT_DIR``); "" = the job
            directory's ``checkpoints/``.
        checkpoint_interval: seconds between the job's own checkpoints, 0 = by ``mtbf``
            (``HPCSCHED_CHECKPOINT_INTERVAL``).
        mtbf: the job's mean time between failures, seconds (``HPCSCHED_MTBF``): with
            ``checkpoint_interval`` 0 its own checkpoints follow the Young/Daly interval of their
            measured cost (:func:`hpcsched.job.checkpoint.young_daly_interval`); 0 as well =
            only when asked.
        record_samples: record each step's sample indices in the metrics
            (``HPCSCHED_RECORD_SAMPLES=1``).
        python: the interpreter that runs the training script (``HPCSCHED_PYTHON``).
        inplace_shrink: the launcher supports shrinking without restarting the surviving
            workers (``HPCSCHED_INPLACE_SHRINK=1``).
        master_addr, master_port: rank 0's TCPStore (torch.distributed's ``MASTER_ADDR``,
            ``MASTER_PORT``).
        extensions: the launcher supports growing through extension allocations
            (``HPCSCHED_EXTENSIONS=1``; ``docs/extensions.md``).
        join_generation: set in an extension job's workers only: the control generation whose
            re-formed process group they join (``HPCSCHED_JOIN_GENERATION``; 0 = a primary
            worker).
        fault_timeout: seconds a collective may wait for a peer while the job runs on extension
            allocations, after which a lost peer is assumed and the group re-forms without it
            (``HPCSCHED_FAULT_TIMEOUT``).
    """

    job_dir: str = _var("HPCSCHED_JOB_DIR", "str", "")
    launch: int = _var("HPCSCHED_LAUNCH", "int", 0)
    generation: int = _var("HPCSCHED_GENERATION", "int", 0)
    nodes: int = _var("HPCSCHED_NODES", "int", 1)
    workers_per_node: int | None = _var("HPCSCHED_WORKERS_PER_NODE", "int", None)
    world_size: int | None = _var("HPCSCHED_WORLD_SIZE", "int", None)
    local_batch_size: int | None = _var("HPCSCHED_LOCAL_BATCH_SIZE", "int", None)
    accumulation_steps: int = _var("HPCSCHED_ACCUMULATION_STEPS", "int", 1)
    global_batch_size: int | None = _var("HPCSCHED_GLOBAL_BATCH_SIZE", "int", None)
    lr_scale: float = _var("HPCSCHED_LR_SCALE", "float", 1.0)
    checkpoint_dir: str = _var("HPCSCHED_CHECKPOINT_DIR", "str", "")
    checkpoint_interval: float = _var("HPCSCHED_CHECKPOINT_INTERVAL", "float", 0.0)
    mtbf: float = _var("HPCSCHED_MTBF", "float", 0.0)
    record_samples: bool = _var("HPCSCHED_RECORD_SAMPLES", "bool", False)
    python: str = _var("HPCSCHED_PYTHON", "str", "")
    inplace_shrink: bool = _var("HPCSCHED_INPLACE_SHRINK", "bool", False)
    master_addr: str = _var("MASTER_ADDR", "str", "127.0.0.1")
    master_port: int = _var("MASTER_PORT", "int", 29500)
    extensions: bool = _var("HPCSCHED_EXTENSIONS", "bool", False)
    join_generation: int = _var("HPCSCHED_JOIN_GENERATION", "int", 0)
    fault_timeout: float = _var("HPCSCHED_FAULT_TIMEOUT", "float", 30.0)

    def to_env(self) -> dict[str, str]:
        """The variables to put in the workers' environment (fields that are None are left
        out, so the reader sees its default)."""
        values = asdict(self)
        return {f.metadata["env"]: _WRITE[f.metadata["kind"]](values[f.name])
                for f in fields(self) if values[f.name] is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LaunchEnv:
        """Read the launch from ``environ`` (e.g. ``os.environ``); unset variables give the
        defaults above.

        Raises:
            ValueError: a number that does not parse.
        """
        return _read(cls, environ)


@dataclass(frozen=True)
class ProcessEnv:
    """What one training process reads about itself (set by the worker shim, torchrun or Slurm).

    Attributes:
        rank, world_size, local_rank: torch.distributed's ``RANK``, ``WORLD_SIZE``,
            ``LOCAL_RANK``.
        restart: Slurm requeues of this job so far (``SLURM_RESTART_COUNT``).
        slurm_job_id: ``SLURM_JOB_ID`` ("" outside Slurm).
        grad_noise: measure the gradient noise (``HPCSCHED_GRAD_NOISE=0`` switches it off; set
            by the user, never by the launcher).
    """

    rank: int = _var("RANK", "int", 0)
    world_size: int = _var("WORLD_SIZE", "int", 1)
    local_rank: int = _var("LOCAL_RANK", "int", 0)
    restart: int = _var("SLURM_RESTART_COUNT", "int", 0)
    slurm_job_id: str = _var("SLURM_JOB_ID", "str", "")
    grad_noise: bool = _var("HPCSCHED_GRAD_NOISE", "bool", True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProcessEnv:
        """Read from ``environ``; unset variables give the defaults above.

        Raises:
            ValueError: a number that does not parse.
        """
        return _read(cls, environ)


__all__ = ["LaunchEnv", "ProcessEnv", "variables"]
