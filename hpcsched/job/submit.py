"""``hpcsub``: submit an elastic training job -- sbatch's command line, plus hpcsched options.

    hpcsub [sbatch options] [hpcsched options] train.py [script args]

Every sbatch option, and every ``#SBATCH`` line of ``train.py``, passes through unchanged.
hpcsched's own options all start with ``--hpcsched-`` (see ``hpcsub --help``). hpcsub renders a
batch script from ``jobscripts/hpcsched-job.sbatch`` that runs ``train.py`` under the hpcsched
launcher, submits it with sbatch, prints what sbatch prints (``Submitted batch job N``, or
``N`` with ``--parsable``) and exits with sbatch's exit status. Bad input: a one-line error,
exit status 2, nothing submitted.

Long options that hpcsub does not know (a newer Slurm's, or a site plugin's such as
``--container-image``) also go to sbatch as written, and sbatch accepts or refuses them. Give
their values with ``=`` (``--container-image=IMAGE``): on the command line an unknown option
followed by a word is refused, since the word could be its value or the script (after an
unknown flag, put ``--`` before the script: ``--container-mount-home -- train.py``). In
``#SBATCH`` lines the word after an unknown option is its value. hpcsub reads the job's shape
only from options it knows (``-N``, ``--gres``, ``--gpus-per-node``, ``-n``,
``--ntasks-per-node``, ...), never from those it passes on.
"""

from __future__ import annotations

import contextlib
import getpass
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Callable, Sequence

from hpcsched import __version__
from hpcsched.job.sbatch_args import (
    Geometry,
    UsageError,
    geometry,
    quote_directive_word,
    read_directives,
    split_argv,
)
from hpcsched.protocol.batching import LR_RULES
from hpcsched.protocol.files import ProtocolError
from hpcsched.protocol.jobdir import CHECKPOINTS_DIR, JobDir, JobSpec, control_dir
from hpcsched.protocol.limits import JobLimits
from hpcsched.resources import shared

TEMPLATE_NAME = "hpcsched-job.sbatch"


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[str], object] | None  # None: a flag without value
    help: str
    metavar: str = ""


# Each parser raises ValueError("expected ..., got '<value>'"); _parse_options puts the
# option's name in front: "--hpcsched-max-nodes: expected an integer, got 'abc'".

def _positive_int(v: str) -> int:
    if not re.fullmatch(r"[0-9]+", v):
        raise ValueError(f"expected an integer, got {v!r}")
    if int(v) < 1:
        raise ValueError(f"expected an integer >= 1, got {v!r}")
    return int(v)


def _nonneg_float(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"expected a number >= 0, got {v!r}")
    return x


def _positive_float(v: str) -> float:
    x = _nonneg_float(v)
    if x == 0:
        raise ValueError(f"expected a number > 0, got {v!r}")
    return x


def _path(v: str) -> str:
    if not v:
        raise ValueError("expected a path, got ''")
    return v


def _application(v: str) -> str:
    if not v or len(v) > 64 or not all(c.isalnum() or c in "-_." for c in v):
        raise ValueError(f"expected 1-64 letters, digits, '-', '_' or '.', got {v!r}")
    return v


def _lr_rule(v: str) -> str:
    if v not in LR_RULES:
        raise ValueError(f"expected one of {', '.join(LR_RULES)}, got {v!r}")
    return v


#: default mean time between failures of one node, seconds (7 days): a conservative figure for
#: GPU nodes; sites set theirs with $HPCSCHED_NODE_MTBF
NODE_MTBF_S = 7 * 86400.0


OPTIONS = {o.name: o for o in [
    Option("min-nodes", _positive_int, "fewest nodes hpcsched may shrink the job to (default 1)", "N"),
    Option("max-nodes", _positive_int,
           "most nodes hpcsched may grow the job to (default: the submitted node count)", "N"),
    Option("min-gpus", _positive_int,
           "like --hpcsched-min-nodes, in GPUs; fewer than a whole node's (or not a multiple of "
           "the GPUs per node) is reached by a layout: hpcsched resize --layout", "N"),
    Option("max-gpus", _positive_int,
           "like --hpcsched-max-nodes, in GPUs (a multiple of the GPUs per node)", "N"),
    Option("batch-size", _positive_int,
           "global batch size to start with, samples (default 32 per GPU)", "B"),
    Option("min-batch-size", _positive_int,
           "smallest global batch size hpcsched may choose (default: the starting one)", "B"),
    Option("max-batch-size", _positive_int,
           "largest global batch size hpcsched may choose (default: the starting one)", "B"),
    Option("max-local-batch-size", _positive_int,
           "per-GPU batch-size limit; above it hpcsched uses gradient accumulation (default: none)", "B"),
    Option("lr-scaling", _lr_rule,
           "learning-rate scaling rule when the global batch changes: linear (Goyal et al. 2017), "
           "sqrt (Krizhevsky 2014), none, or adaptive from the job's gradient noise: adascale "
           "(AdaScale, Johnson et al. 2020) or adamscale (its square root, for Adam-family "
           "optimizers, as AdaptDL); default linear (docs/training-api.md)", "RULE"),
    Option("checkpoint-dir", _path,
           "where the job writes checkpoints (default: <job dir>/checkpoints; must be shared by all nodes)",
           "DIR"),
    Option("checkpoint-interval", _nonneg_float,
           "also checkpoint every this many seconds; 0: only when hpcsched or Slurm asks (default: "
           "the Young/Daly interval, sqrt(2 x measured checkpoint time x the job's MTBF))", "SECONDS"),
    Option("node-mtbf", _positive_float,
           "mean time between failures of one node, seconds, for the default checkpoint interval: "
           f"the job's MTBF is this over its nodes (default $HPCSCHED_NODE_MTBF or {NODE_MTBF_S:.0f}, "
           "7 days)", "SECONDS"),
    Option("python", _path,
           "Python interpreter for the launcher and workers (default: the one running hpcsub)", "PATH"),
    Option("application", _application,
           "what the job trains, for the daemon's throughput priors and GPU-variability class, "
           "e.g. cifar10 or bert (default: the script's file name); jobs that name the same "
           "application share their measured step times, so name different models differently",
           "NAME"),
    Option("record-samples", None,
           "record each step's sample indices in the metrics (for verification; costs disk)"),
    Option("no-resize", None,
           "managed (metrics, pre-timeout checkpoints, status) but never resized: the submitted "
           "size and batch size are its only ones"),
    Option("print-script", None, "print the batch script that would be submitted and exit"),
]}
#: options that set a resize range, which --hpcsched-no-resize pins instead
_RANGE_OPTIONS = ("min-nodes", "max-nodes", "min-gpus", "max-gpus", "min-batch-size",
                  "max-batch-size")

# the hpcsched options that take no value
_FLAGS = frozenset(n for n, o in OPTIONS.items() if o.parse is None)

USAGE = "usage: hpcsub [sbatch options] [hpcsched options] train.py [script args]"


def help_text() -> str:
    lines = [USAGE, "", __doc__.split("\n\n", 2)[2].strip(), "", "hpcsched options:"]
    for o in OPTIONS.values():
        flag = f"--hpcsched-{o.name}" + (f" {o.metavar}" if o.metavar else "")
        lines.append(f"  {flag:<38} {o.help}")
    lines += ["", "Environment: HPCSCHED_CONTROL_DIR (job directories, default ~/.hpcsched/jobs; "
              "must be on a file system all nodes share); HPCSCHED_NODE_MTBF (see --hpcsched-node-mtbf)."]
    return "\n".join(lines)


def template_path() -> Path:
    """Where the batch-script template is: $HPCSCHED_JOBSCRIPTS, else the one hpcsched ships
    (:func:`hpcsched.resources.shared`)."""
    candidates = []
    if os.environ.get("HPCSCHED_JOBSCRIPTS"):
        candidates.append(Path(os.environ["HPCSCHED_JOBSCRIPTS"]))
    with contextlib.suppress(FileNotFoundError):
        candidates.append(shared("jobscripts"))
    for c in candidates:
        if (c / TEMPLATE_NAME).is_file():
            return c / TEMPLATE_NAME
    raise UsageError(f"batch-script template {TEMPLATE_NAME} not found (looked in "
                     f"{', '.join(map(str, candidates))}); set HPCSCHED_JOBSCRIPTS")


def _parse_options(pairs: Sequence[tuple[str, str | None]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in pairs:
        opt = OPTIONS.get(name)
        if opt is None:
            valid = ", ".join(f"--hpcsched-{n}" for n in OPTIONS)
            raise UsageError(f"unknown option --hpcsched-{name} (valid: {valid})")
        if opt.parse is None:
            out[name] = True
            continue
        try:
            out[name] = opt.parse(value)
        except ValueError as exc:
            raise UsageError(f"--hpcsched-{name}: {exc}") from None
    return out


def _check_script(script: str | None, python_override: bool) -> Path:
    if not script:
        raise UsageError("no training script given")
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"training script {script} does not exist")
    if path.suffix != ".py" and not python_override:
        try:
            first = path.open("rb").readline(200)
        except OSError as exc:
            raise UsageError(f"cannot read {script}: {exc.strerror}") from None
        if not (first.startswith(b"#!") and b"python" in first):
            raise UsageError(f"{script} is not a Python script (hpcsched runs Python training "
                             "scripts; use sbatch for others)")
    return path.resolve()


def build_spec(argv: Sequence[str], job_uid: str, job_dir: Path) -> tuple[JobSpec, list[str], dict]:
    """Parse and validate the hpcsub command line (pure apart from reading the script).

    Returns ``(spec, sbatch_args, extra)``; ``extra`` holds ``opts`` (the hpcsched options),
    ``directives`` (the script's ``#SBATCH`` options), ``defaults`` (directives hpcsub adds) and
    ``geometry`` (:class:`~hpcsched.job.sbatch_args.Geometry`).

    Raises:
        UsageError: anything wrong with the command line or the script (one line).
    """
    args = split_argv(argv, hpcsched_flags=_FLAGS)
    opts = _parse_options(args.hpcsched_opts)
    script = _check_script(args.script, "python" in opts)
    try:
        directives = read_directives(script.read_text(errors="replace"))
    except OSError as exc:
        raise UsageError(f"cannot read {args.script}: {exc.strerror}") from None
    geo = geometry(directives, args.sbatch_args)
    nodes, wpn = validate_geometry(geo)
    spec = JobSpec(
        job_uid=job_uid,
        script=str(script),
        script_args=tuple(args.script_args),
        python=str(opts.get("python") or sys.executable),
        submit_dir=os.getcwd(),
        sbatch_args=tuple(args.sbatch_args),
        nodes=nodes,
        limits=job_limits(opts, nodes, wpn),
        checkpoint_dir=str(opts.get("checkpoint-dir") or job_dir / CHECKPOINTS_DIR),
        checkpoint_interval=float(opts.get("checkpoint-interval") or 0.0),
        mtbf=_job_mtbf(opts, nodes),
        record_samples=bool(opts.get("record-samples")),
        user=getpass.getuser(),
        created_at=time.time(),
        application=str(opts.get("application") or ""),
    )
    defaults = _default_directives(geo, wpn, [*directives, *args.sbatch_args], script.name)
    return spec, list(args.sbatch_args), {"opts": opts, "directives": directives,
                                           "defaults": defaults, "geometry": geo}


def _job_mtbf(opts: dict[str, object], nodes: int) -> float:
    """The job's MTBF in seconds for its default checkpoint interval: the node MTBF
    (``--hpcsched-node-mtbf``, else ``$HPCSCHED_NODE_MTBF``, else :data:`NODE_MTBF_S`) over its
    submitted node count; 0 (no interval of its own by MTBF) when the user gave
    ``--hpcsched-checkpoint-interval``.

    Raises:
        UsageError: ``$HPCSCHED_NODE_MTBF`` is not a number > 0."""
    if opts.get("checkpoint-interval") is not None:
        return 0.0
    node = opts.get("node-mtbf")
    if node is None and os.environ.get("HPCSCHED_NODE_MTBF"):
        try:
            node = _positive_float(os.environ["HPCSCHED_NODE_MTBF"])
        except ValueError as exc:
            raise UsageError(f"HPCSCHED_NODE_MTBF: {exc}") from None
    return float(node or NODE_MTBF_S) / max(1, nodes)


def validate_geometry(geo: Geometry) -> tuple[int, int]:
    """The submitted ``(nodes, workers per node)`` of a job shape hpcsched can resize.

    Workers per node = GPUs per node (one worker per GPU), else ``--ntasks-per-node``, else 1.

    Raises:
        UsageError: a job array, GPUs given only in total (``--gpus``), a node range
            (``-N N-M``), or ``--ntasks-per-node`` different from the GPUs per node.
    """
    if geo.array is not None:
        raise UsageError("job arrays (--array) are not supported by hpcsub; submit one job per element")
    if geo.gpus_total is not None and geo.gpus_per_node is None:
        raise UsageError("give GPUs per node (--gres=gpu:K or --gpus-per-node=K), not --gpus: "
                         "hpcsched resizes jobs by whole nodes")
    if geo.nodes_min is not None and geo.nodes_max is not None and geo.nodes_min != geo.nodes_max:
        raise UsageError(f"-N {geo.nodes_min}-{geo.nodes_max}: give one node count and let "
                         "--hpcsched-min-nodes/--hpcsched-max-nodes bound the resizes")
    if geo.gpus_per_node and geo.ntasks_per_node and geo.ntasks_per_node != geo.gpus_per_node:
        raise UsageError(f"--ntasks-per-node={geo.ntasks_per_node} differs from the "
                         f"{geo.gpus_per_node} GPUs per node: hpcsched runs one worker per GPU")
    return geo.nodes_min or 1, geo.gpus_per_node or geo.ntasks_per_node or 1


def job_limits(opts: dict[str, object], nodes: int, workers_per_node: int) -> JobLimits:
    """The resize limits from the hpcsched options, for a job submitted on ``nodes`` nodes.

    Defaults: 1 node to the submitted count; a starting global batch of 32 samples per GPU;
    the batch-size range is the starting size alone; no per-GPU limit; linear LR scaling.

    With ``--hpcsched-no-resize`` the range is the submitted size and batch size alone.

    Raises:
        UsageError: contradictory limits, or a submitted size or batch size outside them.
    """
    if opts.get("no-resize"):
        given = [f"--hpcsched-{o}" for o in _RANGE_OPTIONS if opts.get(o) is not None]
        if given:
            raise UsageError(f"--hpcsched-no-resize pins the job's size: drop {', '.join(given)}")
        opts = {**opts, "min-nodes": nodes, "max-nodes": nodes}
    min_nodes, max_nodes = _node_limits(opts, nodes, workers_per_node)
    batch, bmin, bmax = _batch_limits(opts, nodes, min_nodes, workers_per_node)
    try:
        g = opts.get("min-gpus")
        return JobLimits(workers_per_node=workers_per_node, min_nodes=min_nodes,
                         max_nodes=max_nodes, min_batch_size=bmin, max_batch_size=bmax,
                         max_local_batch_size=opts.get("max-local-batch-size"),
                         base_batch_size=batch, lr_scaling=str(opts.get("lr-scaling") or "linear"),
                         min_gpu_count=g if g is not None and g % workers_per_node else None)
    except ValueError as exc:  # every rule is checked above with the option's name; a safety net
        raise UsageError(str(exc)) from None


def _batch_limits(opts: dict[str, object], nodes: int, min_nodes: int, wpn: int
                  ) -> tuple[int, int, int]:
    """``(batch, min, max)`` global batch sizes in samples from ``--hpcsched-batch-size`` and
    ``--hpcsched-{min,max}-batch-size`` for a job submitted on ``nodes`` nodes of ``wpn``
    GPUs: the starting batch defaults to 32 per GPU, the range to the starting batch alone.

    Raises:
        UsageError: a minimum over the maximum, a starting batch outside the range, or a
            maximum below one sample for each GPU of the smallest size (``min_nodes``).
    """
    batch = opts.get("batch-size") or 32 * nodes * wpn
    bmin = opts.get("min-batch-size") or min(batch, opts.get("max-batch-size") or batch)
    bmax = opts.get("max-batch-size") or max(batch, bmin)
    if bmin > bmax:
        raise UsageError(f"--hpcsched-min-batch-size={bmin} exceeds --hpcsched-max-batch-size={bmax}")
    if not bmin <= batch <= bmax:
        raise UsageError(f"batch size {batch} is outside [{bmin}, {bmax}]")
    if bmax < min_nodes * wpn:
        raise UsageError(f"--hpcsched-max-batch-size={bmax} is smaller than the "
                         f"{min_nodes * wpn} GPUs of the smallest allowed size: "
                         "every GPU needs at least one sample")
    return batch, bmin, bmax


def _node_limits(opts: dict[str, object], nodes: int, wpn: int) -> tuple[int, int]:
    """``(min_nodes, max_nodes)`` from ``--hpcsched-{min,max}-{nodes,gpus}``; must hold ``nodes``."""
    min_nodes, max_nodes = _node_limit(opts, "min", 1, wpn), _node_limit(opts, "max", nodes, wpn)
    if min_nodes > max_nodes:
        hint = "" if "max-nodes" in opts or "max-gpus" in opts else (
            " (the maximum defaults to the submitted node count; raise it with --hpcsched-max-nodes)")
        raise UsageError(f"minimum size {min_nodes} node(s) exceeds maximum {max_nodes}{hint}")
    if not min_nodes <= nodes <= max_nodes:
        raise UsageError(f"the job asks for {nodes} node(s), outside hpcsched's limits "
                         f"[{min_nodes}, {max_nodes}]")
    return min_nodes, max_nodes


def _node_limit(opts: dict[str, object], kind: str, default: int, wpn: int) -> int:
    """One node limit (``kind`` = ``min`` or ``max``) from its -nodes or -gpus option."""
    n, g = opts.get(f"{kind}-nodes"), opts.get(f"{kind}-gpus")
    if n is not None and g is not None:
        raise UsageError(f"give --hpcsched-{kind}-nodes or --hpcsched-{kind}-gpus, not both")
    if g is not None:
        if g % wpn and kind == "max":
            raise UsageError(f"--hpcsched-{kind}-gpus={g} is not a multiple of the {wpn} "
                             "GPUs per node")
        return -(-g // wpn)   # a minimum between whole nodes: min_gpu_count holds it
    return n if n is not None else default


#: seconds before its time limit that Slurm signals a job (``--signal=USR1@<this>``), so that it
#: checkpoints at its next step boundary and requeues itself (``docs/control-protocol.md``,
#: "Slurm's own signals"): Slurm checks time limits every 30 s or so and may signal up to that
#: much earlier (sbatch(1), ``--signal``), and the checkpoint must be written before the limit
PRE_TIMEOUT_S = 120


def _default_directives(geo: Geometry, wpn: int, given: Sequence[str], script_name: str) -> list[str]:
    """Directives hpcsub adds unless the ``given`` sbatch options already say: one task per
    GPU, the script's name as the job name, and a ``SIGUSR1`` :data:`PRE_TIMEOUT_S` seconds
    before the time limit (``--signal``), on which the job checkpoints and requeues itself
    (the template's ``--requeue``; ``--no-requeue`` opts out)."""
    def says(name: str) -> bool:
        return any(a == name or a.startswith(name + "=") for a in given)

    defaults = []
    if geo.ntasks_per_node is None and geo.ntasks is None:
        defaults.append(f"--ntasks-per-node={wpn}")
    if not any(a in ("-J",) or a.startswith(("--job-name", "-J")) for a in given):
        defaults.append(f"--job-name={script_name}")
    if not says("--signal"):
        defaults.append(f"--signal=USR1@{PRE_TIMEOUT_S}")
    return defaults


def render(spec: JobSpec, job_dir: Path, directives: Sequence[str], defaults: Sequence[str],
           argv: Sequence[str], launcher: str = "hpcsched.launcher") -> str:
    """The batch script for ``spec`` from the template; ``launcher``: the module its last line
    runs (``hpcsched.job.standin`` for the scale benchmark's stand-in jobs)."""
    def lines(opts):
        return "\n".join(f"#SBATCH {quote_directive_word(o)}" for o in opts) or "#   (none)"
    return Template(template_path().read_text()).substitute(
        version=__version__,
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        command=shlex.join(["hpcsub", *argv]).replace("\n", " "),
        default_directives=lines(defaults),
        script_name=Path(spec.script).name,
        user_directives=lines(directives),
        job_uid=spec.job_uid,
        job_dir=str(job_dir),
        job_dir_q=shlex.quote(str(job_dir)),
        python_q=shlex.quote(spec.python),
        min_gpus=spec.limits.min_gpus, max_gpus=spec.limits.max_gpus,
        max_nodes=spec.limits.max_nodes, launcher=launcher,
    )


def submit(argv: Sequence[str], *, launcher: str = "hpcsched.launcher",
           files: dict[str, str] | None = None) -> int:
    """Everything ``hpcsub`` does; returns the exit status.

    ``launcher`` and ``files`` are for the scale benchmark's stand-in jobs only
    (:mod:`hpcsched.job.standin`): the module the batch script runs, and files (name -> text)
    written into the job directory before submission."""
    if any(a in ("-h", "--help") for a in argv[: _script_index(argv)]):
        print(help_text())
        return 0
    if "--version" in argv[: _script_index(argv)]:
        print(f"hpcsub (hpcsched) {__version__}")
        return 0
    root = control_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        jd = JobDir.create(root)
    except OSError as exc:
        print(f"hpcsub: error: cannot create a job directory under {root}: {exc.strerror}",
              file=sys.stderr)
        return 1
    except ProtocolError as exc:       # the user's subtree is not theirs, or cannot be made
        print(f"hpcsub: error: {exc}", file=sys.stderr)
        return 1
    try:
        spec, sbatch_args, extra = build_spec(argv, jd.uid, jd.path)
        script = render(spec, jd.path, extra["directives"], extra["defaults"], argv, launcher)
    except UsageError as exc:
        shutil.rmtree(jd.path, ignore_errors=True)
        print(f"hpcsub: error: {exc}", file=sys.stderr)
        return 2
    if extra["opts"].get("print-script"):
        shutil.rmtree(jd.path, ignore_errors=True)
        sys.stdout.write(script)
        return 0
    jd.write_spec(spec)
    for name, text in (files or {}).items():
        (jd.path / name).write_text(text)
    jd.script_path.write_text(script)
    return _run_sbatch(jd, sbatch_args, extra["geometry"].parsable)


def _run_sbatch(jd: JobDir, sbatch_args: list[str], parsable: bool) -> int:
    # "--": an option hpcsub passed on unread that does take a value (given as a flag by
    # mistake) takes "--", not the script, so sbatch still finds the script (and can refuse).
    cmd = ["sbatch", "--parsable", *sbatch_args, "--", str(jd.script_path)]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        shutil.rmtree(jd.path, ignore_errors=True)
        print("hpcsub: error: sbatch not found; is Slurm installed and on PATH?", file=sys.stderr)
        return 1
    first = proc.stdout.readline()  # sbatch --wait prints the id first, then waits
    job_id = first.strip().split(";")[0]
    if job_id.isdigit():
        jd.link_job_id(job_id)
        print(first.strip() if parsable else f"Submitted batch job {job_id}", flush=True)
    elif first:
        sys.stdout.write(first)
    sys.stdout.write(proc.stdout.read())
    rc = proc.wait()
    if not job_id.isdigit():
        shutil.rmtree(jd.path, ignore_errors=True)  # nothing was submitted
    return rc


def _script_index(argv: Sequence[str]) -> int:
    """Index of the script in argv (len(argv) if none), tolerant of bad input."""
    try:
        args = split_argv(argv, hpcsched_flags=_FLAGS)
    except UsageError:
        return len(argv)
    if args.script is None:
        return len(argv)
    return len(argv) - len(args.script_args) - 1


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(submit(argv))


if __name__ == "__main__":
    main()
