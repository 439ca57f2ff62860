"""``hpcsched status``: the hpcsched jobs, as Slurm and their own files describe them.

One ``squeue --json`` call whatever the number of jobs; everything else comes from the job
directories (:mod:`hpcsched.protocol.jobdir`). A job whose files are damaged is still listed, with the
problem in its ``problems`` field, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from hpcsched.protocol import files as ctl
from hpcsched import slurm
from hpcsched.protocol.jobdir import JobDir, control_dir


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


def open_store():
    """The daemon's store if one is configured and exists, else None (status works without)."""
    from hpcsched.daemon.config import ConfigError, load
    from hpcsched.daemon.store import Store

    try:
        url = load().daemon.database_url
    except ConfigError:
        return None
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
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
             "status": a.status, "reason": a.reason, "error": a.error}
            for a in store.actions(job_id, limit=limit)]


def _profile(store, job_id: str) -> list[dict]:
    return [{"world_size": p.world_size, "nodes": p.nodes, "local_batch_size": p.local_batch_size,
             "accumulation_steps": p.accumulation_steps, "step_time": p.step_time,
             "throughput": p.throughput, "steps": p.steps}
            for p in store.profile(job_id)]


def collect(job_ids: list[str] | None = None, store=None,
            decisions: int = 3) -> tuple[list[JobStatus], str | None]:
    """Status of the given (default: all known) hpcsched jobs and Slurm's error, if any.

    With a ``store`` (the daemon's), each job also carries its last ``decisions`` and its
    throughput profile.
    """
    ids = job_ids or JobDir.known_job_ids()
    slurm_error = None
    try:
        queue = slurm.squeue()
    except slurm.SlurmError as exc:
        queue, slurm_error = {}, str(exc)
    rows = []
    for job_id in ids:
        row = JobStatus(job_id=job_id)
        try:
            jd = JobDir.for_job(job_id)
        except LookupError as exc:
            row.problems.append(str(exc))
            rows.append(row)
            continue
        row.job_dir = str(jd.path)
        try:
            spec = jd.read_spec()
            wpn = spec.workers_per_node
            row.name = spec.script.rsplit("/", 1)[-1]
            row.user = spec.user
        except ctl.ProtocolError as exc:
            row.problems.append(str(exc))
            spec, wpn = None, 1
        info = queue.get(job_id)
        if info is not None:
            row.state, row.nodelist, row.nodes = info.state, info.nodes, info.node_count
            row.gpus = info.node_count * (info.gpus_per_node or wpn)
            row.restarts, row.name, row.user = info.restarts, info.name or row.name, info.user or row.user
        elif slurm_error is None:
            row.state = "GONE"
        launcher = jd.read_launcher_state()
        row.launches = int(launcher.get("launches", 0))
        row.phase = str(launcher.get("phase", ""))
        for reader, path, apply in (
            (ctl.read_ack, jd.ack_path, _apply_ack),
            (ctl.read_control, jd.control_path, _apply_control),
            (ctl.read_progress, jd.progress_path, _apply_progress),
        ):
            try:
                obj = reader(path, jd.uid)
            except ctl.ProtocolError as exc:
                row.problems.append(str(exc))
                continue
            except TypeError as exc:
                row.problems.append(f"{path}: {exc}")
                continue
            if obj is not None:
                apply(row, obj)
        if row.global_batch_size is None and spec is not None:
            row.global_batch_size = spec.batch_size
        if store is not None:
            row.decisions = _decisions(store, job_id, decisions)
            row.profile = _profile(store, job_id)
        rows.append(row)
    return rows, slurm_error


def _apply_ack(row: JobStatus, a: ctl.Ack) -> None:
    row.generation, row.ack_state = a.generation, a.state
    if a.state == "applied":
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
def status_command(job_ids, as_json):
    """Show hpcsched jobs (all known, or JOB_IDS): Slurm state, size, batch size, progress,
    and the daemon's decisions with their reasons; one JOB_ID: its whole decision history and
    throughput profile."""
    store = open_store()
    detail = len(job_ids) == 1
    rows, slurm_error = collect(list(job_ids) or None, store, decisions=50 if detail else 3)
    rounds = [asdict(r) for r in store.rounds(limit=10)] if store is not None else []
    if as_json:
        click.echo(json.dumps({"time": time.time(), "control_dir": str(control_dir()),
                               "slurm_error": slurm_error, "rounds": rounds,
                               "jobs": [asdict(r) for r in rows]}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    # piped into a file or another program: do not cut columns to 80 characters
    console = Console() if sys.stdout.isatty() else Console(width=250, soft_wrap=True)
    if slurm_error:
        console.print(f"[yellow]Slurm did not answer: {slurm_error} (showing the jobs' own files)")
    if not rows:
        console.print(f"no hpcsched jobs under {control_dir()}")
        return
    table = Table(box=None, header_style="bold")
    for col in ("JOBID", "NAME", "STATE", "NODELIST", "GPUS", "BATCH", "GEN", "EPOCH",
                "SAMPLES", "SAMPLES/S", "RESTARTS", "LAST DECISION"):
        table.add_column(col, justify="right" if col in ("GPUS", "BATCH", "GEN", "EPOCH", "SAMPLES",
                                                         "SAMPLES/S", "RESTARTS") else "left")
    for r in rows:
        batch = str(r.global_batch_size or "-")
        if r.target_global_batch_size and r.target_global_batch_size != r.global_batch_size:
            batch += f"->{r.target_global_batch_size}"
        gpus = str(r.gpus or "-")
        gen = f"{r.generation}" + (f"/{r.target_generation}" if r.target_generation > r.generation else "")
        table.add_row(r.job_id, r.name, r.state + (f" ({r.phase})" if r.phase and r.state == "RUNNING" and r.phase != "running" else ""),
                      r.nodelist or "-", gpus, batch, gen, str(r.epoch), str(r.samples_processed),
                      f"{r.throughput:.0f}" if r.throughput else "-", str(r.restarts),
                      _last_decision(r))
    console.print(table)
    if rounds:
        last = rounds[0]
        console.print(f"last round {last['id']}: {time.strftime('%H:%M:%S', time.localtime(last['started_at']))}, "
                      f"policy {last['policy']}, {last['jobs']} job(s), {last['actions']} action(s), "
                      f"{last['slurm_calls']} Slurm call(s), {last['duration']:.2f} s"
                      + (f", error: {last['error']}" if last["error"] else ""))
    if detail and rows:
        _print_detail(console, rows[0])
    for r in rows:
        for p in r.problems:
            console.print(f"[red]job {r.job_id}: {p}")
    if slurm_error:
        sys.exit(1)


def _last_decision(r: JobStatus) -> str:
    if r.decisions:
        d = r.decisions[0]
        return (f"{d['kind']} {d['from_nodes']}->{d['to_nodes']}n "
                f"b{d['from_batch_size']}->{d['to_batch_size']} {d['status']}")
    return r.last_reason or "-"


def _print_detail(console, r: JobStatus) -> None:
    from rich.table import Table

    if r.decisions:
        t = Table(title=f"job {r.job_id}: decisions (newest first)", box=None, header_style="bold")
        for col in ("TIME", "ROUND", "CHANGE", "STATUS", "REASON"):
            t.add_column(col)
        for d in r.decisions:
            t.add_row(time.strftime("%H:%M:%S", time.localtime(d["time"])), str(d["round"] or "-"),
                      f"{d['kind']}: {d['from_nodes']}->{d['to_nodes']} node(s), batch "
                      f"{d['from_batch_size']}->{d['to_batch_size']}",
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
