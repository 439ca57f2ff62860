"""``hpcsched status``: the hpcsched jobs, as Slurm and their own files describe them.

One ``squeue --json`` call whatever the number of jobs; everything else comes from the job
directories (:mod:`hpcsched.protocol.jobdir`). A job whose files are damaged is still listed, with
the problem in its ``problems`` field, never a traceback.

:func:`collect` asks Slurm once and builds one :class:`JobStatus` per job with :func:`job_row`;
``--json`` prints :func:`status_json`, the table has one :func:`table_cells` row per job.

A job that grew by extension allocations (:mod:`hpcsched.protocol.extensions`) shows each of
them beside its primary Slurm job (``allocations``), and its GPUs in all (``total_gpus``: the
``layout`` of its last acknowledgement when it has one, else the primary's GPUs plus those of
the extensions ``extensions.json`` lists as joined); :func:`allocations_cells` gives the rows of
the allocations table printed under the jobs.

Status shows a change under way as *in force -> requested* (batch size from the last ack vs.
``control.json``, generation acknowledged / requested). It does not use
:func:`hpcsched.daemon.actuator.current_from`, which answers another question: what to plan the
next change from, where a written request already counts as current.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from hpcsched import slurm
from hpcsched.daemon.access import Caller, NotYourJob
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import Extensions, ExtensionState, format_layout, read_extensions
from hpcsched.protocol.jobdir import JobDir, control_dir
from hpcsched.protocol.kinds import SlurmState


@dataclass
class JobStatus:
    """One row of ``hpcsched status`` (sizes in nodes / GPUs, batch sizes in samples)."""

    job_id: str
    name: str = ""
    user: str = ""
    state: str = "UNKNOWN"          # Slurm state, or GONE once Slurm has forgotten the job
    nodelist: str = ""
    nodes: int = 0
    gpus: int = 0
    global_batch_size: int | None = None
    target_nodes: int | None = None
    target_global_batch_size: int | None = None
    generation: int = 0             # acknowledged
    target_generation: int = 0      # requested
    ack_state: str = ""
    samples_processed: int = 0
    epoch: int = 0
    step: int = 0
    throughput: float = 0.0         # samples/s
    restarts: int = 0
    launches: int = 0
    phase: str = ""                 # launcher phase
    last_reason: str = ""
    job_dir: str = ""
    decisions: list[dict] = field(default_factory=list)   # newest first, from the daemon's journal
    profile: list[dict] = field(default_factory=list)     # measured throughput per configuration
    problems: list[str] = field(default_factory=list)
    #: GPUs in all: the primary's (``gpus``) plus those of its joined extension allocations
    total_gpus: int = 0
    #: ``{node: GPUs}`` the job runs on, its extensions' included (empty: not running)
    layout: dict[str, int] = field(default_factory=dict)
    #: the primary Slurm job and each active extension allocation, primary first: ``role``
    #: (``primary``/``extension``), ``job_id``, ``layout`` ``{node: GPUs}``, ``gpus``,
    #: ``state`` (Slurm's; ``GONE`` once forgotten, ``UNKNOWN`` if Slurm did not answer),
    #: ``extension_state`` (``submitted``/``joined``; "" for the primary)
    allocations: list[dict] = field(default_factory=list)


def open_store():
    """The daemon's store if one is configured, exists and this user may read it, else None
    (status works without: it shows the jobs from Slurm and their directories)."""
    from hpcsched.daemon.config import ConfigError, load
    from hpcsched.daemon.store import Store

    try:
        url = load().daemon.database_url
    except ConfigError:
        return None
    try:
        if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
            return None
    except OSError:   # a store directory this user may not enter (0700: the store's owner's)
        return None
    try:
        store = Store(url)
        return store if store.current_revision() else None
    except Exception:  # an unreachable or foreign database: status still shows the jobs
        return None


def _decisions(store, job_id: str, limit: int) -> list[dict]:
    return [{"time": a.created_at, "round": a.round_id, "kind": a.kind,
             "from_nodes": a.from_nodes, "to_nodes": a.to_nodes,
             "from_batch_size": a.from_batch_size, "to_batch_size": a.to_batch_size,
             "status": a.status, "reason": a.reason, "error": a.error,
             "layout": ",".join(a.placement) if any(":" in p for p in a.placement) else "",
             "mechanism": a.mechanism or _suffix_mechanism(a.reason)}
            for a in store.actions(job_id, limit=limit)]


def _profile(store, job_id: str) -> list[dict]:
    return [{"world_size": p.world_size, "nodes": p.nodes, "local_batch_size": p.local_batch_size,
             "accumulation_steps": p.accumulation_steps, "step_time": p.step_time,
             "throughput": p.throughput, "steps": p.steps}
            for p in store.profile(job_id)]


def collect(job_ids: list[str] | None = None, store=None, decisions: int = 3,
            caller: Caller | None = None, history: bool = True) -> tuple[list[JobStatus], str | None]:
    """Status of the given (default: all known) hpcsched jobs and Slurm's error, if any.
    Without ``history`` and ``job_ids``, only the jobs Slurm lists as active (pending,
    running, ...; every known job when Slurm does not answer).

    One ``squeue --json`` call for all jobs (:func:`job_row` per job). With a ``store`` (the
    daemon's), each job also carries its last ``decisions`` and its throughput profile.
    ``caller`` (default: this process's user) sees their own jobs only, unless an admin
    (:mod:`hpcsched.daemon.access`): the owner is Slurm's user of the job, or, for a job Slurm
    no longer knows, the owner of its job directory.

    Raises:
        NotYourJob: one of the given ``job_ids`` belongs to another user (nothing of it read).
    """
    caller = caller or Caller.current()
    ids = job_ids or JobDir.known_job_ids()
    try:
        queue, slurm_error = slurm.squeue(), None
    except slurm.SlurmError as exc:
        queue, slurm_error = {}, str(exc)
    rows = []
    for job_id in ids:
        info = queue.get(job_id)
        if not (job_ids or history or slurm_error) and (info is None or not info.active):
            continue   # finished: shown with --all
        owner = info.user if info is not None else _directory_owner(job_id)
        if not caller.may_act_on(owner):
            if job_ids:
                caller.check(job_id, owner)
            continue
        row = job_row(job_id, info, slurm_answered=slurm_error is None, queue=queue)
        if store is not None and row.job_dir:
            row.decisions = _decisions(store, job_id, decisions)
            row.profile = _profile(store, job_id)
        rows.append(row)
    return rows, slurm_error


def _directory_owner(job_id: str) -> str:
    """The user owning a job's directory (who ran hpcsub), or "" if it cannot be told."""
    try:
        return JobDir.locate(job_id).owner()
    except (LookupError, OSError):
        return ""


def job_row(job_id: str, info: slurm.JobInfo | None, slurm_answered: bool = True,
            queue: Mapping[str, slurm.JobInfo] | None = None) -> JobStatus:
    """One job's row from what Slurm said of it (``info``; None: Slurm does not know it) and
    its job directory. A file that cannot be read adds a line to ``problems``, never raises.
    ``queue``: Slurm's jobs by id (``squeue``), where the extension allocations' states are
    looked up (None: not asked).

    The batch size shown is the one in force: the last acknowledgement's (an ack of any state
    reports the configuration in force, :class:`hpcsched.protocol.files.Ack`), else the
    submitted one; the requested one is ``target_global_batch_size`` (from ``control.json``).
    """
    row = JobStatus(job_id=job_id)
    try:
        jd = JobDir.for_job(job_id, user=info.user) if info is not None else JobDir.locate(job_id)
    except LookupError as exc:
        row.problems.append(str(exc))
        return row
    row.job_dir = str(jd.path)
    try:
        spec = jd.read_spec()
        row.name, row.user = spec.script.rsplit("/", 1)[-1], spec.user
    except ctl.ProtocolError as exc:
        row.problems.append(str(exc))
        spec = None
    _apply_slurm(row, info, spec.limits.workers_per_node if spec else 1, slurm_answered)
    _apply_launcher(row, jd.read_launcher_state())
    ack = None
    for reader, path, apply in (
        (ctl.read_ack, jd.ack_path, _apply_ack),
        (ctl.read_control, jd.control_path, _apply_control),
        (ctl.read_progress, jd.progress_path, _apply_progress),
    ):
        try:
            obj = reader(path, jd.uid)
        except ctl.ProtocolError as exc:
            row.problems.append(str(exc))
        except TypeError as exc:
            row.problems.append(f"{path}: {exc}")
        else:
            if obj is not None:
                apply(row, obj)
                ack = obj if isinstance(obj, ctl.Ack) else ack
    if row.global_batch_size is None and spec is not None:
        row.global_batch_size = spec.limits.base_batch_size
    owner = info.user if info is not None else jd.owner()
    _apply_allocations(row, info, ack, _read_extensions(row, jd), owner,
                       spec.limits.workers_per_node if spec else 1, queue, slurm_answered)
    return row


def _read_extensions(row: JobStatus, jd: JobDir) -> Extensions | None:
    """The job's ``extensions.json`` (None: absent); a file that cannot be read (malformed,
    another job's, too large, a link) adds a line to ``problems`` and counts as absent."""
    try:
        return read_extensions(jd.extensions_path, jd.uid)
    except ctl.ProtocolError as exc:
        row.problems.append(str(exc))
    except (TypeError, ValueError) as exc:   # e.g. an entry whose node is not a string
        row.problems.append(f"{jd.extensions_path}: {exc}")
    return None


def _apply_allocations(row: JobStatus, info: slurm.JobInfo | None, ack: ctl.Ack | None,
                       ext: Extensions | None, owner: str, workers_per_node: int,
                       queue: Mapping[str, slurm.JobInfo] | None, slurm_answered: bool) -> None:
    """``allocations``, ``layout`` and ``total_gpus`` (see :class:`JobStatus`).

    The primary's GPUs per node are Slurm's (``tres_per_node``, else the spec's workers per
    node). An extension's Slurm state is shown only if Slurm runs it for ``owner`` (the
    primary's user): its id comes from a file the job writes. Joined extensions count while the primary runs;
    ``Ack.layout`` (the layout the job acknowledged running on) wins when present.
    """
    primary: dict[str, int] = {}
    if info is not None:
        per = info.gpus_per_node or workers_per_node
        primary = {n: per for n in slurm.expand_hostlist(info.nodes)}
        row.allocations.append(_allocation("primary", info.job_id, primary, row.state))
    joined = {}
    for e in ext.active if ext is not None else ():
        state = _slurm_state(e.job_id, queue, owner, slurm_answered)
        row.allocations.append(_allocation("extension", e.job_id, {e.node: e.gpus}, state, e.state))
        if e.state == ExtensionState.JOINED:
            joined[e.node] = joined.get(e.node, 0) + e.gpus
    if row.state != SlurmState.RUNNING:
        row.total_gpus = row.gpus
        return
    if ack is not None and ack.layout:
        row.layout = dict(ack.layout)
    else:
        row.layout = dict(primary)
        for node, gpus in joined.items():
            row.layout[node] = row.layout.get(node, 0) + gpus
    row.total_gpus = sum(row.layout.values()) if row.layout else row.gpus


def _slurm_state(job_id: str, queue: Mapping[str, slurm.JobInfo] | None, owner: str,
                 slurm_answered: bool) -> str:
    """Slurm's state of job ``job_id`` if Slurm runs it for ``owner``; ``OTHER USER`` if for
    someone else; ``GONE`` if Slurm answered without it, ``UNKNOWN`` if not asked or down."""
    info = (queue or {}).get(job_id)
    if info is not None:
        return info.state if info.user == owner else "OTHER USER"
    return "GONE" if slurm_answered and queue is not None else "UNKNOWN"


def _allocation(role: str, job_id: str, layout: dict[str, int], state: str,
                extension_state: str = "") -> dict:
    return {"role": role, "job_id": job_id, "layout": layout, "gpus": sum(layout.values()),
            "state": state, "extension_state": str(extension_state)}


def _apply_slurm(row: JobStatus, info: slurm.JobInfo | None, workers_per_node: int,
                 slurm_answered: bool) -> None:
    if info is None:
        if slurm_answered:
            row.state = "GONE"
        return
    row.state, row.nodelist, row.nodes = info.state, info.nodes, info.node_count
    row.gpus = info.node_count * (info.gpus_per_node or workers_per_node)
    row.restarts, row.name, row.user = info.restarts, info.name or row.name, info.user or row.user


def _apply_launcher(row: JobStatus, st: ctl.LauncherState | None) -> None:
    if st is not None:
        row.launches, row.phase = st.launches, str(st.phase)


def _apply_ack(row: JobStatus, a: ctl.Ack) -> None:
    row.generation, row.ack_state = a.generation, a.state
    row.global_batch_size = a.global_batch_size


def _apply_control(row: JobStatus, c: ctl.Control) -> None:
    row.target_generation = c.generation
    row.target_nodes, row.target_global_batch_size = c.nodes, c.global_batch_size
    row.last_reason = c.reason


def _apply_progress(row: JobStatus, p: ctl.Progress) -> None:
    row.samples_processed, row.epoch, row.step = p.samples_processed, p.epoch, p.step
    row.throughput = p.throughput if not p.finished else 0.0


@click.command("status")
@click.argument("job_ids", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--gpus", "gpus", is_flag=True,
              help="Show the GPUs instead: latest probe, against its peers, passive speed, slow flag.")
@click.option("--all", "history", is_flag=True,
              help="Also the finished jobs whose directories are kept ([retention] job_days).")
def status_command(job_ids, as_json, gpus, history):
    """Show hpcsched jobs (those Slurm lists as active; --all: every known one; or JOB_IDS):
    Slurm state, size, batch size, progress, and the daemon's decisions with their reasons; one
    JOB_ID: its whole decision history and throughput profile. ``--gpus``: the GPUs the daemon
    knows (docs/slurm-plugins.md)."""
    store = open_store()
    if gpus:
        _status_gpus(store, as_json)
        return
    detail = len(job_ids) == 1
    try:
        rows, slurm_error = collect(list(job_ids) or None, store, decisions=50 if detail else 3,
                                    history=history)
    except NotYourJob as exc:
        click.echo(f"hpcsched status: refused: {exc}", err=True)
        sys.exit(2)
    rounds = [asdict(r) for r in store.rounds(limit=10)] if store is not None else []
    if as_json:
        click.echo(json.dumps(status_json(rows, rounds, slurm_error), indent=1))
        return
    _print_status(rows, rounds, slurm_error, detail)
    if slurm_error and rows:
        sys.exit(1)


def _status_gpus(store, as_json: bool) -> None:
    """``hpcsched status --gpus`` (:mod:`hpcsched.daemon.gpu_status`); no store: no GPUs."""
    from rich.console import Console

    from hpcsched.daemon import gpu_status
    from hpcsched.daemon.config import ConfigError, ProbeSettings, load

    try:
        settings = load().probe
    except ConfigError:
        settings = ProbeSettings()
    rows = gpu_status.gpu_rows(store, settings) if store is not None else []
    if as_json:
        click.echo(json.dumps(gpu_status.gpus_json(rows, settings), indent=1))
        return
    console = Console() if sys.stdout.isatty() else Console(width=250, soft_wrap=True)
    gpu_status.print_gpus(console, rows, settings)


def status_json(rows: list[JobStatus], rounds: list[dict], slurm_error: str | None) -> dict:
    """What ``hpcsched status --json`` prints: ``time`` (Unix s), ``control_dir``,
    ``slurm_error`` (None if Slurm answered), the daemon's last ``rounds`` (newest first) and
    one object per job (the fields of :class:`JobStatus`)."""
    return {"time": time.time(), "control_dir": str(control_dir()), "slurm_error": slurm_error,
            "rounds": rounds, "jobs": [asdict(r) for r in rows]}


# -- the table ----------------------------------------------------------------------------------

COLUMNS = ("JOBID", "NAME", "STATE", "NODELIST", "GPUS", "BATCH", "GEN", "EPOCH", "SAMPLES",
           "SAMPLES/S", "RESTARTS", "LAST DECISION")
_RIGHT = frozenset({"GPUS", "BATCH", "GEN", "EPOCH", "SAMPLES", "SAMPLES/S", "RESTARTS"})


def _print_status(rows: list[JobStatus], rounds: list[dict], slurm_error: str | None,
                  detail: bool) -> None:
    from rich.console import Console

    # piped into a file or another program: do not cut columns to 80 characters
    console = Console() if sys.stdout.isatty() else Console(width=250, soft_wrap=True)
    if slurm_error:
        console.print(f"[yellow]Slurm did not answer: {slurm_error} (showing the jobs' own files)")
    if not rows:
        console.print(f"no active hpcsched jobs under {control_dir()} (--all: finished ones too)")
        return
    console.print(_jobs_table(rows))
    extensions = allocations_cells(rows)
    if extensions:
        console.print(_table("allocations (primary and extension Slurm jobs)",
                             ALLOCATION_COLUMNS, extensions, right=("GPUS",)))
    if rounds:
        console.print(_round_line(rounds[0]))
    if detail:
        _print_detail(console, rows[0])
    for r in rows:
        for p in r.problems:
            console.print(f"[red]job {r.job_id}: {p}")


def _table(title: str, columns: tuple[str, ...], cells: list[tuple[str, ...]],
           right: tuple[str, ...] = ()):
    from rich.table import Table

    table = Table(title=title, box=None, header_style="bold")
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left")
    for row in cells:
        table.add_row(*row)
    return table


def _jobs_table(rows: list[JobStatus]):
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in _RIGHT else "left")
    for r in rows:
        table.add_row(*table_cells(r))
    return table


def table_cells(r: JobStatus) -> tuple[str, ...]:
    """One job's cells of the status table, in :data:`COLUMNS` order. BATCH and GEN show
    ``in force->requested`` and ``acknowledged/requested`` while a change is under way; STATE
    adds the launcher's phase to a running job that is not simply running."""
    batch = str(r.global_batch_size or "-")
    if r.target_global_batch_size and r.target_global_batch_size != r.global_batch_size:
        batch += f"->{r.target_global_batch_size}"
    gen = f"{r.generation}" + (f"/{r.target_generation}" if r.target_generation > r.generation else "")
    state = r.state
    if r.phase and r.state == SlurmState.RUNNING and r.phase != "running":
        state += f" ({r.phase})"
    return (r.job_id, r.name, state, r.nodelist or "-", _gpus_cell(r), batch, gen,
            str(r.epoch), str(r.samples_processed), f"{r.throughput:.0f}" if r.throughput else "-",
            str(r.restarts), _last_decision(r))


def _gpus_cell(r: JobStatus) -> str:
    """The job's GPUs; ``6 (4+2)`` when extension allocations add to the primary's."""
    total = r.total_gpus or r.gpus
    if total > r.gpus > 0:
        return f"{total} ({r.gpus}+{total - r.gpus})"
    return str(total or "-")


ALLOCATION_COLUMNS = ("JOBID", "ALLOCATION", "ROLE", "NODE GPUS", "GPUS", "STATE")


def allocations_cells(rows: list[JobStatus]) -> list[tuple[str, ...]]:
    """The allocations table's rows (:data:`ALLOCATION_COLUMNS`), one per Slurm job of each job
    that has an active extension allocation: the primary first, then its extensions (STATE:
    Slurm's, and the extension's own ``submitted``/``joined``)."""
    out = []
    for r in rows:
        if not any(a["role"] == "extension" for a in r.allocations):
            continue
        for a in r.allocations:
            state = a["state"] + (f" ({a['extension_state']})" if a["extension_state"] else "")
            out.append((r.job_id, a["job_id"], a["role"], format_layout(a["layout"]) or "-",
                        str(a["gpus"]), state))
    return out


def _round_line(last: dict) -> str:
    """The daemon's last round in one line."""
    return (f"last round {last['id']}: {time.strftime('%H:%M:%S', time.localtime(last['started_at']))}, "
            f"policy {last['policy']}, {last['jobs']} job(s), {last['actions']} action(s), "
            f"{last['slurm_calls']} Slurm call(s), {last['duration']:.2f} s"
            + (f", error: {last['error']}" if last["error"] else ""))


def _last_decision(r: JobStatus) -> str:
    if r.decisions:
        d = r.decisions[0]
        return (f"{d['kind']} {d['from_nodes']}->{d['to_nodes']}n "
                f"b{d['from_batch_size']}->{d['to_batch_size']} {d['status']}")
    return r.last_reason or "-"


def _suffix_mechanism(reason: str) -> str | None:
    """The mechanism of a change journaled before ``actions.mechanism`` existed (migration
    0006), from its reason's ``[by <mechanism>]`` suffix; else None."""
    if reason.endswith("]") and " [by " in reason:
        return reason[reason.rindex(" [by ") + 5:-1]
    return None


def _print_detail(console, r: JobStatus) -> None:
    from rich.table import Table

    if r.decisions:
        t = Table(title=f"job {r.job_id}: decisions (newest first)", box=None, header_style="bold")
        for col in ("TIME", "ROUND", "CHANGE", "STATUS", "REASON"):
            t.add_column(col)
        for d in r.decisions:
            t.add_row(time.strftime("%H:%M:%S", time.localtime(d["time"])), str(d["round"] or "-"),
                      f"{d['kind']}{' by ' + d['mechanism'] if d['mechanism'] else ''}: "
                      f"{d['from_nodes']}->{d['to_nodes']} node(s)"
                      + (f" ({d['layout']})" if d.get("layout") else "")
                      + f", batch {d['from_batch_size']}->{d['to_batch_size']}",
                      d["status"] + (f" ({d['error']})" if d["error"] else ""), d["reason"])
        console.print(t)
    if r.profile:
        t = Table(title=f"job {r.job_id}: measured throughput", box=None, header_style="bold")
        for col in ("GPUS", "NODES", "LOCAL BATCH", "ACCUM", "STEP TIME (s)", "SAMPLES/S", "STEPS"):
            t.add_column(col, justify="right")
        for p in r.profile:
            t.add_row(str(p["world_size"]), str(p["nodes"]), str(p["local_batch_size"]),
                      str(p["accumulation_steps"]), f"{p['step_time']:.4f}",
                      f"{p['throughput']:.0f}", str(p["steps"]))
        console.print(t)
