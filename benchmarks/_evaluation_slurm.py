"""The evaluation's simulations as one Slurm job array: ``--executor slurm``.

:func:`run_array` (the driver, on the login node) writes the runs the run cache lacks to a task
file, submits them as one job array with plain ``sbatch``, waits for it, and hands back their
results read from the cache. Each array task (this file run as a script: ``python
_evaluation_slurm.py TASKFILE``, task index ``$SLURM_ARRAY_TASK_ID``) simulates its share with
the code path of a local run (:func:`_evaluation_runs._execute`, one BLAS thread) and writes
each result into the same run cache (:mod:`_run_cache`: same code version, same keys), so the
driver renders exactly what a local run renders, and a stopped or failed array leaves every
finished result in the cache for the next run.

The run cache directory, this checkout and the driver's Python interpreter (``sys.executable``)
must be on a file system that the compute nodes share, at the same paths. The task file and the
tasks' output live in ``<cache directory>/slurm/<date-time>-<random>/``, removed when every run is in
the cache, kept (with the outputs) when one is not.

sbatch(1) options used: ``--parsable`` (print only the job id), ``--array=0-K[%M]`` (tasks 0 to
K, at most M running at once), ``--job-name``, ``--output=DIR/task-%A_%a.out`` (``%A``: the
array's job id, ``%a``: the task index; stderr goes there too), ``--chdir`` (this checkout),
``--cpus-per-task=1``, and when given ``--partition`` and ``--time``; then the ``--slurm-arg``
words as written (``--mem=4G``, ``--account=X``, ``--qos=Y``...).
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from _run_cache import RunCache, code_version

ROOT = Path(__file__).resolve().parent.parent
#: sacct's states of a task that ended without finishing its work (sacct(1), "JOB STATE CODES")
FAILED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL",
                           "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT"})
FIRST_POLL = 2.0        # s between the first two looks at the queue; doubled each time up to
MAX_POLL = 30.0         # s, the interval on a long array
SETTLE = 60.0           # s to wait for results that sacct says were written (a shared file
                        # system may show another node's new files late) before calling them lost
SHOWN = 10              # failed tasks named one by one, in the progress and in the error
SQUEUE_TRIES = 10       # squeue failures in a row (slurmctld busy or restarting) before giving up


class SlurmArrayError(SystemExit):
    """The job array could not be submitted, or some of its tasks left their runs out of the
    cache. A :class:`SystemExit`: the evaluation stops with the message (no traceback) and
    exit status 1."""


@dataclass(frozen=True)
class SlurmOptions:
    """How to submit the array: ``partition`` and ``time`` (sbatch's ``--time``, e.g.
    ``"2:00:00"``; per task) when given, ``max_parallel`` tasks running at once (the ``%M`` of
    ``--array``; ``None``: as many as Slurm starts), ``extra`` sbatch words, and ``chunk``
    simulations per task."""

    partition: str | None = None
    time: str | None = None
    max_parallel: int | None = None
    extra: tuple[str, ...] = ()
    chunk: int = 1
    job_name: str = "hpcsched-eval"


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--executor {local,slurm}`` and the Slurm executor's options."""
    g = parser.add_argument_group("Slurm executor (benchmarks/_evaluation_slurm.py)")
    g.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local: --jobs processes here; slurm: the runs the cache lacks as one "
                        "sbatch job array (the cache, this checkout and this Python on a file "
                        "system the compute nodes share)")
    g.add_argument("--slurm-partition", default=None, help="sbatch --partition")
    g.add_argument("--slurm-time", default=None, help="sbatch --time, per task (e.g. 2:00:00)")
    g.add_argument("--slurm-max-parallel", type=int, default=None, metavar="M",
                   help="at most M array tasks at once (--array=0-K%%M)")
    g.add_argument("--slurm-chunk", type=int, default=1, metavar="N",
                   help="simulations per array task (default 1)")
    g.add_argument("--slurm-arg", action="append", default=[], metavar="ARG",
                   help="one more sbatch word, repeatable, with '=' (an sbatch option starts with "
                        "'-'): --slurm-arg=--mem=4G")


def options(args: argparse.Namespace) -> SlurmOptions | None:
    """The Slurm executor's options from :func:`add_options`' arguments, ``None`` for the local
    executor; a :class:`SlurmArrayError` for values sbatch would refuse or the cache forbids."""
    if args.executor != "slurm":
        return None
    if getattr(args, "no_cache", False):
        raise SlurmArrayError("--executor slurm: the array tasks hand their results back "
                              "through the run cache; leave out --no-cache")
    for name in ("slurm_max_parallel", "slurm_chunk"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SlurmArrayError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return SlurmOptions(args.slurm_partition, args.slurm_time, args.slurm_max_parallel,
                        tuple(args.slurm_arg), args.slurm_chunk)


def output_path(work: Path, job_id: str, task: int | str) -> Path:
    """Where array task ``task`` of job ``job_id`` writes its output (``--output``; with
    ``"%A"`` and ``"%a"``, sbatch's pattern for it)."""
    return work / f"task-{job_id}_{task}.out"


def sbatch_command(opts: SlurmOptions, tasks: int, work: Path, script: Path) -> list[str]:
    """The sbatch command line that submits ``script`` as an array of ``tasks`` tasks."""
    array = f"0-{tasks - 1}" + (f"%{opts.max_parallel}" if opts.max_parallel else "")
    cmd = ["sbatch", "--parsable", f"--array={array}", f"--job-name={opts.job_name}",
           f"--output={output_path(work, '%A', '%a')}", f"--chdir={ROOT}", "--cpus-per-task=1"]
    if opts.partition:
        cmd.append(f"--partition={opts.partition}")
    if opts.time:
        cmd.append(f"--time={opts.time}")
    return cmd + list(opts.extra) + [str(script)]


def array_script(python: str, task_file: Path) -> str:
    """The batch script every array task runs: this file as a script, on ``task_file``."""
    return ("#!/bin/sh\n"
            "# hpcsched evaluation (benchmarks/_evaluation_slurm.py): simulate array task\n"
            "# $SLURM_ARRAY_TASK_ID's share of the runs and put the results into the run cache\n"
            f"exec {shlex.quote(python)} {shlex.quote(str(Path(__file__).resolve()))} "
            f"{shlex.quote(str(task_file))}\n")


def _indices(spec: str) -> list[int]:
    """Array task indices from squeue's or sacct's ``%i``/``JobID`` tail: ``4``, or a range of
    tasks not started yet, ``[5-9%2]`` or ``[1,3,5-7]``."""
    spec = spec.strip("[]").split("%")[0]
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _rows(text: str, job_id: str) -> list[tuple[int, list[str]]]:
    """``(task index, the other fields)`` of each ``|``-separated line about ``job_id``'s array
    tasks (its steps, ``<id>_<task>.batch``, left out)."""
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        m = re.fullmatch(rf"{re.escape(job_id)}_(\d+|\[[\d,%-]+\])", fields[0])
        if m:
            out += [(i, fields[1:]) for i in _indices(m.group(1))]
    return out


def parse_squeue(text: str, job_id: str) -> dict[int, str]:
    """``task index -> state`` from ``squeue -h -r -j ID -o %i|%T``: the tasks still queued."""
    return {i: f[0] for i, f in _rows(text, job_id) if f}


def parse_sacct(text: str, job_id: str) -> dict[int, tuple[str, str]]:
    """``task index -> (state, exit code)`` from ``sacct -n -P -X -j ID -o
    JobID,State,ExitCode``; the state's first word (``CANCELLED by 0`` is ``CANCELLED``)."""
    return {i: (f[0].split()[0], f[1] if len(f) > 1 else "") for i, f in _rows(text, job_id)
            if f and f[0].strip()}


def _last_line(path: Path) -> str:
    """The last non-empty line of a task's output ("" if it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def failure_message(job_id: str, tasks: int, missing: dict[int, list[str]],
                    states: dict[int, tuple[str, str]], work: Path) -> str:
    """The error for the tasks in ``missing`` (task -> its runs, described), which ended without
    putting those runs into the cache: each one's state and exit code (sacct's; "state unknown"
    without accounting), its output file and that file's last line; the first :data:`SHOWN`
    of them, then how many more."""
    lines = [f"{len(missing)} of {tasks} tasks of Slurm job array {job_id} left runs out of the "
             "run cache (the results of the others are kept: run the same command again to "
             "simulate only what is missing):"]
    for task in sorted(missing)[:SHOWN]:
        state, code = states.get(task, ("state unknown", ""))
        out = output_path(work, job_id, task)
        lines.append(f"  task {task} ({state}{f', exit code {code}' if code else ''}): "
                     f"{'; '.join(missing[task])}; output {out}")
        last = _last_line(out)
        if last:
            lines.append(f"    {last}")
    if len(missing) > SHOWN:
        lines.append(f"  and {len(missing) - SHOWN} more tasks: their outputs are in {work}")
    return "\n".join(lines)


def _call(*cmd: str) -> subprocess.CompletedProcess:
    """Run a Slurm command (the tests put a fake in its place)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


_sleep = time.sleep     # the tests put a fake in its place


def _states(job_id: str) -> dict[int, tuple[str, str]]:
    """sacct's view of the array's tasks; empty without accounting (sacct fails)."""
    try:
        got = _call("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode")
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_sacct(got.stdout, job_id) if got.returncode == 0 else {}


def _queued(job_id: str) -> dict[int, str] | str:
    """The array's tasks still in the queue (pending, running, completing...), or squeue's
    error when it fails."""
    got = _call("squeue", "-h", "-r", "-j", job_id, "-o", "%i|%T")
    if got.returncode != 0:
        if "Invalid job id" in got.stderr:      # gone from slurmctld's memory: all ended
            return {}
        return got.stderr.strip() or f"exit status {got.returncode}"
    return parse_squeue(got.stdout, job_id)


def wait(job_id: str, tasks: int, work: Path) -> None:
    """Poll squeue until no task of the array is queued: every ``FIRST_POLL`` s at first,
    doubling up to ``MAX_POLL`` s. Prints a line when the counts change, and one per task that
    sacct shows failed (with its output file) as soon as it shows it; gives up after
    ``SQUEUE_TRIES`` squeue failures in a row."""
    interval, last, told, errors = FIRST_POLL, "", set[int](), 0
    while True:
        left = _queued(job_id)
        if isinstance(left, str):
            errors += 1
            if errors >= SQUEUE_TRIES:
                raise SlurmArrayError(f"squeue on Slurm job array {job_id} failed {errors} times "
                                      f"in a row ({left}); the array is left as it is")
            _sleep(interval)
            continue
        errors = 0
        for task, (state, code) in sorted(_states(job_id).items()):
            if state in FAILED_STATES and task not in told and len(told) < SHOWN:
                told.add(task)
                print(f"Slurm job array {job_id}: task {task} {state} (exit code {code}); "
                      f"output {output_path(work, job_id, task)}", flush=True)
        running = sum(s == "RUNNING" for s in left.values())
        line = (f"Slurm job array {job_id}: {tasks - len(left)} of {tasks} tasks ended, "
                f"{running} running, {len(left) - running} waiting")
        if line != last:
            print(line, flush=True)
            last = line
        if not left:
            return
        _sleep(interval)
        interval = min(2 * interval, MAX_POLL)


def _describe(run) -> str:
    return f"{run.label} on {run.workload} ({run.granularity}, seed {run.seed})"


def run_array(runs: Sequence, cache: RunCache, opts: SlurmOptions) -> list[tuple]:
    """Simulate ``runs`` as one job array and return their ``(SimResult, summary)`` from
    ``cache``, in order. Ctrl-C while waiting cancels the array (scancel). A
    :class:`SlurmArrayError` when the cache keeps nothing, sbatch refuses, or a task ends without
    putting its runs into the cache (after every other task has ended)."""
    if cache.dir is None:
        raise SlurmArrayError("--executor slurm hands results back through the run cache, and "
                              "there is none: the code version cannot be told (not a git "
                              "checkout, or git missing), or --no-cache")
    unique = list({repr(r): r for r in runs}.values())      # the cache's key, once each
    n = math.ceil(len(unique) / opts.chunk)
    shares = [unique[i::n] for i in range(n)]
    (cache.dir.parent / "slurm").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=cache.dir.parent / "slurm"))
    task_file, script = work / "tasks.pkl", work / "array.sh"
    task_file.write_bytes(pickle.dumps({"version": cache.version, "cache": str(cache.dir.parent),
                                        "shares": shares}, protocol=pickle.HIGHEST_PROTOCOL))
    script.write_text(array_script(sys.executable, task_file))
    cmd = sbatch_command(opts, n, work, script)
    try:
        got = _call(*cmd)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmArrayError(f"--executor slurm: cannot run sbatch: {exc}") from exc
    if got.returncode != 0:
        raise SlurmArrayError(f"sbatch refused the job array ({' '.join(cmd)}): "
                              f"{got.stderr.strip()}")
    job_id = got.stdout.strip().split(";")[0]
    print(f"submitted {len(unique)} simulations as Slurm job array {job_id} ({n} tasks); "
          f"output in {work}", flush=True)
    try:
        wait(job_id, n, work)
    except KeyboardInterrupt:
        _call("scancel", job_id)
        print(f"\ncancelled Slurm job array {job_id}; the results of the tasks that ended are "
              "in the run cache", file=sys.stderr, flush=True)
        raise
    missing = _settle(job_id, shares, cache)
    if missing:
        raise SlurmArrayError(failure_message(job_id, n, missing, _states(job_id), work))
    shutil.rmtree(work, ignore_errors=True)
    return [cache.get(r) for r in runs]


def _settle(job_id: str, shares: list[list], cache: RunCache) -> dict[int, list[str]]:
    """The tasks whose runs are not in the cache, described; those sacct does not show failed
    are looked for again for up to ``SETTLE`` s (another node's new files can show late on a
    shared file system, and sacct late too)."""
    deadline = time.monotonic() + SETTLE
    while True:
        missing = {t: [_describe(r) for r in rs if cache.get(r) is None]
                   for t, rs in enumerate(shares)}
        missing = {t: d for t, d in missing.items() if d}
        states = _states(job_id) if missing else {}
        if all(states.get(t, ("",))[0] in FAILED_STATES for t in missing) or time.monotonic() > deadline:
            return missing
        _sleep(2.0)


def task_main(argv: Sequence[str]) -> None:
    """One array task: simulate this task's share of the runs in the task file (those not in
    the cache yet) and put each result into the cache. Refuses to run when ``hpcsched/`` has
    changed since the submission: its results would be kept under the other code's version."""
    task_file = Path(argv[0])
    task = int(os.environ["SLURM_ARRAY_TASK_ID"])
    spec = pickle.loads(task_file.read_bytes())
    now = code_version()
    if now is not None and now != spec["version"]:
        raise SystemExit(f"hpcsched/ has changed since the array was submitted (code version "
                         f"{now}, submitted {spec['version']}): run the evaluation again")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from _evaluation_runs import _execute

    from hpcsched.sim.cli import single_threaded_blas

    cache = RunCache(spec["version"], Path(spec["cache"]))
    runs = spec["shares"][task]
    for i, run in enumerate(runs, 1):
        if cache.get(run) is not None:
            print(f"[{i}/{len(runs)}] {_describe(run)}: in the cache already", flush=True)
            continue
        with single_threaded_blas():
            res, summary = _execute(run)
        cache.put(run, (res, summary))
        print(f"[{i}/{len(runs)}] {_describe(run)}: avg JCT {summary['avg_jct']:.1f} s "
              f"({summary['wall_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    task_main(sys.argv[1:])
