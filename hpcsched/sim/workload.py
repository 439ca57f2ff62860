"""Workloads for the simulator: trace files, the shipped data sets and the store's history, read
into :class:`~hpcsched.sim.WorkloadJob` records sorted by submit time.

Entry point: :func:`load_workload` (``spec`` is a CSV path or a short name):

=====================  ===========================================================================
``PATH``               a CSV file; its header picks the format (Pollux or PAL/Blox, below)
``pollux:N``           Pollux workload ``N`` (1..8) at load 1.0 (160 jobs over about 8 h)
``pollux:N@L``         the same at load ``L`` = 0.5, 1.0, 1.5 or 2.0 (80, 160, 240, 320 jobs)
``pal:N``              PAL's Sia-Philly trace ``N`` (1..8, 160 jobs)
``philly:COUNT``       ``COUNT`` jobs sampled from the Philly summary with ``seed``
``store[:URL]``        the jobs recorded in hpcsched's store (default URL: the daemon's config,
                       ``$HPCSCHED_DATABASE_URL`` overriding)
=====================  ===========================================================================

Every user mistake (missing file, unknown header, bad row, unknown application or model,
non-positive GPUs or batch size, a value out of bounds, unknown short name, load not shipped,
empty store) raises :class:`WorkloadError`, a ``ValueError`` whose message is one line naming the
file (and line). Bounds (past them a policy would crash or a job never finish): numbers finite;
submit times 0..10 years (s); GPU counts 1..2**24; batch sizes 1..2**24 samples and at most 16 x
the application's largest validated batch; a PAL job's iterations at most 10 years of work.

Units: seconds (submit times from the start of the trace), samples (batch sizes), GPUs.

Shipped data (``hpcsched/data/``, each folder with its licence and ``SOURCE.md``):
``pollux/workloads/<L>/workload-<N>.csv``, ``pollux/philly.csv.gz``,
``pollux/results-jobload/<policy>-<L>.json`` (:func:`pollux_results`) and
``pal/workloads/philly/workload-<N>.csv``.

Pollux format
-------------
``name,time,application,num_replicas,batch_size`` (Pollux artifact, github.com/petuum/adaptdl
branch ``osdi21-artifact``, ``simulator/workloads*/``): ``time`` is the submit time in s,
``num_replicas`` and ``batch_size`` the hand-tuned fixed size ("TunedJobs"). Each row becomes
``WorkloadJob(name, submit_time=time, application, gpus=num_replicas, batch_size,
app_class=POLLUX_APP_CLASS[application])``: a convergence job (``iterations`` is ``None``).
An optional ``rigid`` column (0 or 1) marks other users' plain jobs
(:attr:`~hpcsched.sim.WorkloadJob.rigid`; what ``hpcsched replay --rigid-fraction`` writes).

PAL/Blox format
---------------
``job_id,num_gpus,submit_time,duration,model[,batch_size]``, the Sia-Philly traces of the PAL
artifact (github.com/hal-uw/blox-pal, branch ``artifact``, ``workload-traces/philly/``). What the
artifact does with them (read in its stored versions; the code here is our own):

* ``simulator_sia.py`` passes the trace to ``workload/workload.py``'s ``Workload(trace=...)``,
  whose ``populate_from_trace`` makes one ``Job`` (``workload/job.py``) per row with
  ``job_total_iteration = duration`` (a number of iterations), ``job_gpu_demand = num_gpus``,
  ``job_arrival_time = submit_time`` (s), ``job_iteration_time = get_per_iter_time(model)`` and
  ``job_perfclass = get_perfclass(model)``; ``batch_size`` is not read. Unknown models: the
  iteration-time lookup fails (``KeyError``) and the class defaults to A; we reject them.
* ``get_per_iter_time`` is a fixed table of per-iteration seconds ("median iter times from
  cluster run"): copied into :data:`PAL_MODELS`. ``get_perfclass``: resnet50 -> A, vgg19 -> C,
  PointNet -> D, GPT2, DCGAN and BERT -> B.
* In simulation (``blox/deployment/grpc_client_rm.py``, ``get_metrics``) a running job advances
  ``round_duration / (job_pm_penalty * locality_penalty * job_iteration_time)`` iterations per
  round (360 s rounds in ``simulator_sia.py``) and ends once ``job_total_iteration`` is reached.
  ``blox/blox_manager.py`` (``exec_jobs``) sets ``job_pm_penalty`` = the largest
  ``PerfVar_class<X>`` among the job's GPUs and ``locality_penalty`` = 1.7 when the GPUs span
  nodes, else 1.0. The iteration time does not depend on the number of GPUs: a job's run time
  is ``duration x iteration_time x penalties`` at its submitted size.

So a PAL/Blox row becomes ``WorkloadJob(name=f"{model}-{job_id}", submit_time, gpus=num_gpus,
iterations=duration, iteration_time=PAL_MODELS[model].iteration_time,
app_class=PAL_MODELS[model].app_class, application=PAL_MODELS[model].application)``. The
application is only a label (naming, plots); it is the Pollux application closest to the model.
Without a ``batch_size`` column the batch size is :func:`default_batch_size` of that
application (it does not change a fixed-work job's run time).

Philly sample
-------------
``philly:COUNT`` draws ``COUNT`` distinct jobs, with ``numpy.random.default_rng(seed)``, from
``pollux/philly.csv.gz`` (82,247 Microsoft Philly jobs, ``timestamp,duration,num_gpus,gpu_time,
cluster``) among those with 1..64 GPUs, ``duration >= 60`` s and ``gpu_time < 1000`` GPU-hours
(the last two as Pollux's generator, ``simulator/workload.py``, filters). The sampled jobs keep
their order of arrival, and their timestamps are rescaled linearly onto [0, 8 h] (first job at
0, last at 28,800 s), the span of Pollux's workloads. Each job keeps its GPU count and gets a
Pollux application by its GPU-time, with Pollux's categories (same generator): under 1 GPU-hour
cifar10 or ncf, 1 to 10 GPU-hours deepspeech2 or bert (each a fair coin from the same
generator), 10 to 100 yolov3, 100 and more imagenet. Batch size: tuned for the job's GPU count as
Pollux's generator tunes its "TunedJobs" (:func:`hpcsched.sim.tuned.tuned_batch_size`; ncf on
1 GPU: 32,768 samples, 33 s of training, where the untuned 256 take 1,444 s).

Store history
-------------
``store[:URL]``: every job in the store's ``jobs`` table (:meth:`hpcsched.daemon.store.Store.jobs`)
becomes a job submitted at its ``submit_time`` (else ``first_seen``) minus the earliest one,
asking for ``nodes x workers_per_node`` GPUs (``nodes`` from the stored spec, else
``max_nodes``) at ``base_batch_size``, application = the job's ``app_class`` when it names a
Pollux application (case-insensitive), else ``cifar10``.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from hpcsched.policies.variability import APP_CLASSES
from hpcsched.sim import WorkloadJob
from hpcsched.sim.tuned import tuned_batch_size

DATA = Path(__file__).resolve().parent.parent / "data"

#: PAL variability class (A..D) of each Pollux application. PAL's classes (PAL artifact,
#: ``profiles.json``; /work/shared/data/README.md): A = ResNet-50-like conv nets, the class most
#: sensitive to per-GPU variability; B and C = BERT-like; D = insensitive (PageRank-like).
#: imagenet (ResNet-50), cifar10 (ResNet-18) and yolov3 (Darknet-53) are ResNet-like conv nets
#: -> A; bert and deepspeech2 (recurrent speech model) -> B; ncf (small embedding MLP,
#: memory-bound) -> D.
POLLUX_APP_CLASS: dict[str, str] = APP_CLASSES   # one table, shared with placement

#: (base, max) global batch size in samples of each Pollux application: the smallest and the
#: largest ``<B>`` of the Pollux artifact's ``simulator/traces/<app>/validation-<B>.csv``.
APP_BATCH_SIZES: dict[str, tuple[int, int]] = {
    "bert": (12, 384), "cifar10": (128, 4096), "deepspeech2": (20, 640), "imagenet": (200, 12800),
    "ncf": (256, 32768), "yolov3": (8, 512)}


@dataclass(frozen=True)
class PalModel:
    """How the PAL artifact simulates a model of its traces: seconds per iteration, PAL class,
    and the Pollux application that stands for it here (a label only)."""

    iteration_time: float
    app_class: str
    application: str


#: The PAL artifact's models (``workload/workload.py``: ``get_per_iter_time``, ``get_perfclass``).
#: Applications: resnet50 and vgg19 are ImageNet conv nets -> imagenet; DCGAN and PointNet are
#: small vision models -> cifar10; BERT and GPT2 are transformers -> bert.
PAL_MODELS: dict[str, PalModel] = {
    "resnet50": PalModel(0.17540429367763434, "A", "imagenet"),
    "vgg19": PalModel(0.300610341, "C", "imagenet"),
    "PointNet": PalModel(0.28125, "D", "cifar10"),
    "DCGAN": PalModel(0.0469266931, "B", "cifar10"),
    "BERT": PalModel(0.179, "B", "bert"),
    "GPT2": PalModel(3.5714, "B", "bert"),
}

#: Loads at which the Pollux workloads ship (arrival rate relative to the original).
POLLUX_LOADS: tuple[str, ...] = ("0.5", "1.0", "1.5", "2.0")
#: Policies whose published Pollux results ship (:func:`pollux_results`).
POLLUX_POLICIES: tuple[str, ...] = ("pollux", "optimus", "tiresias")
#: Workload numbers shipped for ``pollux:N`` and ``pal:N``.
WORKLOAD_NUMBERS = range(1, 9)

#: Span of a ``philly:COUNT`` sample's arrivals, s (as Pollux's workloads).
PHILLY_SPAN = 8 * 3600.0
PHILLY_MAX_GPUS = 64
PHILLY_MIN_DURATION = 60.0
PHILLY_MAX_GPU_TIME = 1000 * 3600.0
#: GPU-time categories (upper bound in GPU-seconds, applications chosen among).
PHILLY_BUCKETS: tuple[tuple[float, tuple[str, ...]], ...] = (
    (1 * 3600.0, ("cifar10", "ncf")),
    (10 * 3600.0, ("deepspeech2", "bert")),
    (100 * 3600.0, ("yolov3",)),
    (math.inf, ("imagenet",)),
)

#: Bounds (module docstring): latest submit time (s), largest count, batch-size factor.
MAX_SUBMIT_TIME = 10 * 365 * 86400.0
MAX_COUNT = 2**24
BATCH_FACTOR = 16

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
PAL_COLUMNS = ("job_id", "num_gpus", "submit_time", "duration", "model")

_SHORT = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):")
_EPOCH = datetime(1970, 1, 1)


class WorkloadError(ValueError):
    """A workload cannot be read; the message is one line naming the file (and line)."""


# -- public API ----------------------------------------------------------------------------------


def load_workload(spec: str, *, seed: int = 0) -> tuple[str, list[WorkloadJob]]:
    """Read the workload ``spec`` (a CSV path or a short name, see the module docstring).

    Returns ``(display name, jobs sorted by submit time)``; ties keep their order in the source.
    ``seed`` only matters for ``philly:COUNT``. Display names: ``pollux:N@L``, ``pal:N``,
    ``philly:COUNT-seedS``, ``store:URL`` (password hidden), or the file's name.
    Raises :class:`WorkloadError`.
    """
    spec = os.fspath(spec).strip()
    if not spec:
        raise WorkloadError("empty workload name")
    if spec == "store" or spec.startswith("store:"):
        from hpcsched.sim.store_workload import load_store, store_name, store_url

        url = store_url(spec[len("store:"):].strip() or None)
        return store_name(url), load_store(url)
    m = _SHORT.match(spec)
    if m is not None:
        kind = m.group(1)
        rest = spec[m.end():]
        if kind == "pollux":
            number, load = _parse_pollux(spec, rest)
            return f"pollux:{number}@{load}", load_csv(pollux_workload_path(number, load))
        if kind == "pal":
            number = _parse_number(spec, rest, "pal:N")
            return f"pal:{number}", load_csv(pal_workload_path(number))
        if kind == "philly":
            count = _parse_count(spec, rest)
            return f"philly:{count}-seed{seed}", sample_philly(count, seed=seed)
        if not Path(spec).exists():
            raise WorkloadError(
                f"{spec}: unknown workload name {kind + ':'!r}; expected a CSV file, "
                "pollux:N[@LOAD], pal:N, philly:COUNT or store[:URL]")
    return Path(spec).name, load_csv(spec)


def scale_workload(jobs: Sequence[WorkloadJob], scale: float) -> list[WorkloadJob]:
    """The same ``jobs`` with submit times x ``scale`` (arrival gaps shrunk as their work is by
    :attr:`hpcsched.sim.engine.SimConfig.work_scale`: ``hpcsched simulate --scale``). Pure.
    Raises :class:`WorkloadError` for ``scale`` outside ``(0, 1]``."""
    if not 0.0 < scale <= 1.0:
        raise WorkloadError(f"scale must be in (0, 1], got {scale!r}")
    return [replace(j, submit_time=j.submit_time * scale) for j in jobs]


def make_rigid(jobs: Sequence[WorkloadJob], fraction: float) -> list[WorkloadJob]:
    """The same ``jobs`` with a ``fraction`` of them made other users' plain jobs
    (:attr:`~hpcsched.sim.WorkloadJob.rigid`: they run at their submitted size, unmanaged), spread
    evenly over the submission order: job ``i`` (0-based) is rigid when ``floor((i + 1) x
    fraction) > floor(i x fraction)``, so 0.3 marks the 3rd, 6th, 10th, 13th... of every 10. No
    randomness: a mixed run and its all-elastic twin differ only in those jobs. Pure.

    Raises :class:`WorkloadError` for ``fraction`` outside ``[0, 1]``."""
    if not 0.0 <= fraction <= 1.0:
        raise WorkloadError(f"rigid fraction must be in [0, 1], got {fraction!r}")
    return [replace(j, rigid=math.floor((i + 1) * fraction) > math.floor(i * fraction))
            for i, j in enumerate(jobs)]


def load_csv(path: str | os.PathLike) -> list[WorkloadJob]:
    """Read a Pollux or PAL/Blox CSV file (format from its header); jobs sorted by submit time.

    Raises :class:`WorkloadError` naming the file and line of the first problem.
    """
    where = os.fspath(path)
    p = Path(path)
    if p.is_dir():
        raise WorkloadError(f"{where}: is a directory, not a workload file")
    if not p.exists():
        raise WorkloadError(f"{where}: no such workload file")
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            rows = list(_rows(csv.reader(f)))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError(f"{where}: cannot read: {_one_line(exc)}") from None
    if not rows:
        raise WorkloadError(f"{where}: empty file; expected a header "
                            f"{','.join(POLLUX_COLUMNS)!r} or {','.join(PAL_COLUMNS)!r}")
    header_line, header = rows[0]
    names = [h.strip().lower() for h in header]
    if len(set(names)) != len(names):
        raise WorkloadError(f"{where}:{header_line}: repeated column in header {','.join(header)!r}")
    if set(POLLUX_COLUMNS) <= set(names):
        jobs = _pollux_rows(where, names, rows[1:])
    elif set(PAL_COLUMNS) <= set(names):
        jobs = _pal_rows(where, names, rows[1:])
    else:
        raise WorkloadError(
            f"{where}:{header_line}: unknown header {','.join(header)!r}; expected Pollux "
            f"{','.join(POLLUX_COLUMNS)!r} or PAL/Blox {','.join(PAL_COLUMNS)}[,batch_size]")
    if not jobs:
        raise WorkloadError(f"{where}: no jobs after the header")
    return _sorted(jobs)


def sample_philly(count: int, *, seed: int = 0) -> list[WorkloadJob]:
    """``count`` jobs drawn from the Philly summary with ``numpy.random.default_rng(seed)``;
    arrivals rescaled onto 8 h (see the module docstring). Deterministic for a seed."""
    where = f"philly:{count}"
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise WorkloadError(f"{where}: the number of jobs must be a positive integer")
    ts, duration, gpus, gpu_time = _philly()
    eligible = np.flatnonzero((gpus >= 1) & (gpus <= PHILLY_MAX_GPUS)
                              & (duration >= PHILLY_MIN_DURATION)
                              & (gpu_time < PHILLY_MAX_GPU_TIME))
    if count > eligible.size:
        raise WorkloadError(f"{where}: only {eligible.size} Philly jobs are eligible "
                            f"(1..{PHILLY_MAX_GPUS} GPUs, at least {PHILLY_MIN_DURATION:g} s, "
                            f"under {PHILLY_MAX_GPU_TIME / 3600:g} GPU-hours)")
    try:
        rng = np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: bad seed {seed!r}: {_one_line(exc)}") from None
    picked = rng.choice(eligible, size=count, replace=False)
    picked = picked[np.lexsort((picked, ts[picked]))]       # by arrival, then by trace row
    coin = rng.random(count)
    t = ts[picked]
    span = float(t[-1] - t[0])
    submit = (t - t[0]) / span * PHILLY_SPAN if span > 0 else np.zeros(count)
    jobs = []
    for i, row in enumerate(picked):
        apps = next(a for limit, a in PHILLY_BUCKETS if gpu_time[row] < limit)
        app = apps[min(int(coin[i] * len(apps)), len(apps) - 1)]
        n = int(gpus[row])
        jobs.append(WorkloadJob(name=f"{app}-{i}", submit_time=round(float(submit[i]), 3),
                                application=app, gpus=n, batch_size=tuned_batch_size(app, n),
                                app_class=POLLUX_APP_CLASS[app]))
    return jobs


def default_batch_size(application: str, gpus: int) -> int:
    """The application's base batch size times ``gpus``, clipped to its largest (samples)."""
    base, top = APP_BATCH_SIZES[application]
    return min(base * gpus, top)


def pollux_workload_path(number: int, load: str = "1.0") -> Path:
    """The shipped Pollux workload ``number`` (1..8) at ``load`` (one of :data:`POLLUX_LOADS`)."""
    return DATA / "pollux" / "workloads" / load / f"workload-{number}.csv"


def pal_workload_path(number: int) -> Path:
    """The shipped PAL Sia-Philly trace ``number`` (1..8)."""
    return DATA / "pal" / "workloads" / "philly" / f"workload-{number}.csv"


def pollux_results(policy: str, load: str | float = "1.0") -> dict:
    """Pollux's published simulator results for ``policy`` (pollux, optimus, tiresias) at
    ``load``: ``{"avgs": {"workload-N": average JCT}, "mean": their mean, "jcts":
    {"workload-N": {job name: JCT}}}``, in seconds."""
    lo = _load_name(str(load))
    if policy not in POLLUX_POLICIES or lo is None:
        raise WorkloadError(f"no published Pollux results for {policy!r} at load {load!r}; "
                            f"policies {', '.join(POLLUX_POLICIES)}, loads "
                            f"{', '.join(POLLUX_LOADS)}")
    path = DATA / "pollux" / "results-jobload" / f"{policy}-{lo}.json"
    with path.open(encoding="utf-8") as f:
        return json.load(f)


# -- CSV rows ------------------------------------------------------------------------------------


def _rows(reader) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank row."""
    for fields in reader:
        if not fields or all(not x.strip() for x in fields):
            continue
        yield reader.line_num, fields


def _fields(where: str, names: Sequence[str], line: int, fields: list[str]) -> dict[str, str]:
    if len(fields) != len(names):
        raise WorkloadError(f"{where}:{line}: expected {len(names)} fields "
                            f"({','.join(names)}), got {len(fields)}")
    return {n: v.strip() for n, v in zip(names, fields)}


def _identified_rows(where: str, names: Sequence[str], rows, column: str,
                     label: str) -> Iterator[tuple[str, dict[str, str], str]]:
    """``(where:line, fields, id)`` per row, the id (``column``) non-empty and unique."""
    seen = set()
    for line, fields in rows:
        r = _fields(where, names, line, fields)
        at = f"{where}:{line}"
        ident = r[column]
        if not ident:
            raise WorkloadError(f"{at}: empty {label}")
        if ident in seen:
            raise WorkloadError(f"{at}: {label} {ident!r} appears twice")
        seen.add(ident)
        yield at, r, ident


def _pollux_rows(where: str, names: Sequence[str], rows) -> list[WorkloadJob]:
    jobs = []
    for at, r, name in _identified_rows(where, names, rows, "name", "job name"):
        app = r["application"].lower()
        if app not in POLLUX_APP_CLASS:
            raise WorkloadError(f"{at}: unknown application {r['application']!r}; known: "
                                f"{', '.join(sorted(POLLUX_APP_CLASS))}")
        jobs.append(WorkloadJob(
            name=name, submit_time=_time(at, "time", r["time"]), application=app,
            gpus=_positive_int(at, "num_replicas", r["num_replicas"]),
            batch_size=_positive_int(at, "batch_size", r["batch_size"], *_batch_limit(app)),
            app_class=POLLUX_APP_CLASS[app], rigid=_flag(at, "rigid", r.get("rigid") or "0")))
    return jobs


def _flag(at: str, column: str, text: str) -> bool:
    """A 0/1 column (``true``/``false`` also)."""
    value = text.strip().lower()
    if value not in ("0", "1", "true", "false"):
        raise WorkloadError(f"{at}: {column} must be 0 or 1, got {text!r}")
    return value in ("1", "true")


_PAL_BY_LOWER = {k.lower(): k for k in PAL_MODELS}


def _pal_rows(where: str, names: Sequence[str], rows) -> list[WorkloadJob]:
    jobs = []
    for at, r, job_id in _identified_rows(where, names, rows, "job_id", "job_id"):
        model_key = _PAL_BY_LOWER.get(r["model"].lower())
        if model_key is None:
            raise WorkloadError(f"{at}: unknown model {r['model']!r}; known: "
                                f"{', '.join(PAL_MODELS)}")
        model = PAL_MODELS[model_key]
        gpus = _positive_int(at, "num_gpus", r["num_gpus"])
        iterations = _number(at, "duration", r["duration"])
        if iterations <= 0:
            raise WorkloadError(f"{at}: duration (iterations) must be positive, "
                                f"got {r['duration']!r}")
        if iterations * model.iteration_time > MAX_SUBMIT_TIME:
            raise WorkloadError(f"{at}: duration (iterations) must be at most "
                                f"{MAX_SUBMIT_TIME / model.iteration_time:.0f} for {model_key} (10 "
                                f"years of work), got {r['duration']!r}")
        if r.get("batch_size"):
            batch = _positive_int(at, "batch_size", r["batch_size"],
                                  *_batch_limit(model.application))
        else:
            batch = default_batch_size(model.application, gpus)
        jobs.append(WorkloadJob(
            name=f"{model_key}-{job_id}", submit_time=_time(at, "submit_time", r["submit_time"]),
            application=model.application, gpus=gpus, batch_size=batch,
            app_class=model.app_class, iterations=iterations,
            iteration_time=model.iteration_time))
    return jobs


def _number(at: str, what: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise WorkloadError(f"{at}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(v):
        raise WorkloadError(f"{at}: {what} must be finite, got {text!r}")
    return v


def _time(at: str, what: str, text: str) -> float:
    """A submit time in [0, MAX_SUBMIT_TIME] seconds."""
    v = _number(at, what, text)
    if v < 0:
        raise WorkloadError(f"{at}: {what} (s) must not be negative, got {text!r}")
    if v > MAX_SUBMIT_TIME:
        raise WorkloadError(f"{at}: {what} (s) must be at most {MAX_SUBMIT_TIME:.0f} (10 years), "
                            f"got {text!r}")
    return v


def _positive_int(at: str, what: str, text: str, maximum: int = MAX_COUNT, why: str = "") -> int:
    """An integer in [1, maximum] (``why``: the reason for the maximum, in the message)."""
    v = _number(at, what, text)
    if v != int(v) or v < 1:
        raise WorkloadError(f"{at}: {what} must be a positive integer, got {text!r}")
    if v > maximum:
        raise WorkloadError(f"{at}: {what} must be at most {maximum}{why}, got {text!r}")
    return int(v)


def _batch_limit(app: str) -> tuple[int, str]:
    """The largest batch size (samples) a workload may give ``app``, and why."""
    top = APP_BATCH_SIZES[app][1]
    limit = min(MAX_COUNT, BATCH_FACTOR * top)
    return limit, f" ({BATCH_FACTOR} x {app}'s largest validated batch size {top}, at most 2**24)"


# -- helpers -------------------------------------------------------------------------------------


def _sorted(jobs: list[WorkloadJob]) -> list[WorkloadJob]:
    return sorted(jobs, key=lambda j: j.submit_time)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _load_name(text: str) -> str | None:
    try:
        v = float(text)
    except ValueError:
        return None
    for lo in POLLUX_LOADS:
        if abs(float(lo) - v) < 1e-9:
            return lo
    return None


def _parse_number(spec: str, text: str, usage: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise WorkloadError(f"{spec}: expected {usage} with N in 1..8")
    n = int(text)
    if n not in WORKLOAD_NUMBERS:
        raise WorkloadError(f"{spec}: no shipped workload {n}; N is 1..8")
    return n


def _parse_pollux(spec: str, rest: str) -> tuple[int, str]:
    number_text, _, load_text = rest.partition("@")
    number = _parse_number(spec, number_text, "pollux:N or pollux:N@LOAD")
    if not load_text:
        return number, "1.0"
    load = _load_name(load_text)
    if load is None:
        raise WorkloadError(f"{spec}: load {load_text!r} is not shipped; loads: "
                            f"{', '.join(POLLUX_LOADS)}")
    return number, load


def _parse_count(spec: str, text: str) -> int:
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise WorkloadError(f"{spec}: expected philly:COUNT with COUNT a positive integer")
    return int(text)


@lru_cache(maxsize=1)
def _philly() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Philly summary as arrays: timestamp (s), duration (s), GPUs, GPU-time (GPU-s)."""
    path = DATA / "pollux" / "philly.csv.gz"
    ts, dur, gpus, gtime = [], [], [], []
    try:
        with gzip.open(path, "rt", newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader)]
            cols = [header.index(c) for c in ("timestamp", "duration", "num_gpus", "gpu_time")]
            for line, row in _rows(reader):
                try:
                    t, d, g, gt = (row[i] for i in cols)
                    ts.append((datetime.fromisoformat(t) - _EPOCH).total_seconds())
                    dur.append(float(d))
                    gpus.append(float(g))
                    gtime.append(float(gt))
                except (ValueError, IndexError):
                    raise WorkloadError(f"{path}:{line}: malformed Philly row") from None
    except (OSError, EOFError, StopIteration, csv.Error, ValueError) as exc:
        if isinstance(exc, WorkloadError):
            raise
        raise WorkloadError(f"{path}: cannot read the Philly summary: {_one_line(exc)}") from None
    return np.array(ts), np.array(dur), np.array(gpus), np.array(gtime)
