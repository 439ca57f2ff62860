"""Markdown for docs/evaluation.md (benchmarks/evaluation.py): tables from the figures it
computed, and the notes that explain them. No simulation and no arithmetic on results beyond
formatting happens here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def fmt(x: float | None, spec: str = ".0f") -> str:
    """``x`` formatted, ``-`` for a figure that does not exist."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def pct(x: float | None) -> str:
    """A relative change (-0.43) as ``-43.0%``."""
    return "-" if x is None else f"{x:+.1%}"


def metric_table(title: str, means: Mapping[tuple[str, str, str], float | None],
                 rows: Sequence[tuple[str, str]], loads: Sequence[str],
                 published: Sequence[tuple[str, Sequence[float]]] = (),
                 spec: str = ".0f") -> list[str]:
    """One table: a row per (policy, granularity), a column per load, ``means[(policy,
    granularity, load)]`` in the cells; ``published`` rows (label, one value per load) below."""
    out = [f"**{title}**\n", "| policy | granularity | " + " | ".join(f"load {ld}" for ld in loads) + " |",
           "|---|---|" + "---:|" * len(loads)]
    for p, g in rows:
        out.append(f"| `{p}` | {g} | " + " | ".join(fmt(means.get((p, g, ld)), spec) for ld in loads) + " |")
    for label, vals in published:
        out.append(f"| {label} | (published) | " + " | ".join(fmt(v, spec) for v in vals) + " |")
    out.append("")
    return out


def ratio_table(title: str, ratios: Mapping[tuple[str, str], float | None],
                policies: Sequence[str], loads: Sequence[str]) -> list[str]:
    """Per policy and load, a ratio shown as a relative change (node vs gpu granularity)."""
    out = [f"**{title}**\n", "| policy | " + " | ".join(f"load {ld}" for ld in loads) + " |",
           "|---|" + "---:|" * len(loads)]
    for p in policies:
        out.append(f"| `{p}` | " + " | ".join(pct(None if ratios.get((p, ld)) is None
                                                  else ratios[(p, ld)] - 1) for ld in loads) + " |")
    out.append("")
    return out


def fidelity_section(ours: Mapping[int, float | None], published: Mapping[int, float]) -> list[str]:
    """Section 1: our Tiresias against Pollux's published Tiresias, per workload."""
    out = ["## 1. Fidelity: Tiresias on Pollux workloads at load 1.0\n",
           "| workload | hpcsched tiresias | Pollux's Tiresias (published) | difference |",
           "|---|---:|---:|---:|"]
    for w, p in published.items():
        o = ours.get(w)
        out.append(f"| {w} | {fmt(o)} | {p:.0f} | {pct(None if o is None else o / p - 1)} |")
    vals = [v for v in ours.values() if v is not None]
    if vals:
        mo, mp = sum(vals) / len(vals), sum(published.values()) / len(published)
        out.append(f"| **mean** | **{mo:.0f}** | **{mp:.0f}** | **{mo / mp - 1:+.1%}** |")
    out.append("")
    out.append(FIDELITY_NOTES)
    return out


def targets_section(checks: Iterable[tuple[str, bool | None, str]], quick: bool) -> list[str]:
    """Issue 9's targets as PASS / FAIL / NOT RUN lines, each with the figures it was judged on."""
    out = ["## 3. Targets (issue 9), judged on this run\n"]
    if quick:
        out.append("*Quick run: judged on workloads 1-2 at load 1.0 only, not the targets' full "
                   "setting.*\n")
    out += [check_line(name, ok, detail) for name, ok, detail in checks]
    out.append("")
    return out


def check_line(name: str, ok: bool | None, detail: str) -> str:
    """One target as section 3 shows it."""
    word = "NOT RUN" if ok is None else ("PASS" if ok else "FAIL")
    return f"- **{word}** {name}: {detail}"


def replace_check_lines(doc: str, checks: Iterable[tuple[str, bool | None, str]],
                        prefixes: Sequence[str]) -> str:
    """``doc`` with each section-3 line whose target starts with ``prefixes[i]`` replaced by the
    line of ``checks``' ``i``-th (the other targets stay as their run left them)."""
    lines = doc.split("\n")
    for (name, ok, detail), prefix in zip(checks, prefixes, strict=True):
        for i, line in enumerate(lines):
            if line.startswith("- **") and line.split("** ", 1)[-1].startswith(prefix):
                lines[i] = check_line(name, ok, detail)
    return "\n".join(lines)


def pal_table(mode_title: str, rows: Sequence[tuple[int, Mapping[str, float]]],
              geo: Mapping[str, float | None]) -> list[str]:
    """Per PAL trace, average JCT under each placement and the change against packed."""
    out = [f"**{mode_title}**\n",
           "| trace | packed | PM-First | PAL | PM-First vs packed | PAL vs packed |",
           "|---|---:|---:|---:|---:|---:|"]
    for w, r in rows:
        a, pm, pa = r.get("packed"), r.get("pm-first"), r.get("pal")
        rel = (lambda x: None if x is None or not a else x / a - 1)  # noqa: E731
        out.append(f"| {w} | {fmt(a)} | {fmt(pm)} | {fmt(pa)} | {pct(rel(pm))} | {pct(rel(pa))} |")
    out.append(f"| **geomean** | | | | **{pct(geo.get('pm-first'))}** | **{pct(geo.get('pal'))}** |")
    out.append("")
    return out


def pal_summary(geo: Mapping[str, Mapping[str, float | None]], titles: Mapping[str, str],
                published: Mapping[str, float]) -> list[str]:
    """Geomean change against packed per way of running, beside PAL's published figures, each
    with how many points it is from the published one (the reading of each factor)."""
    def cell(g: Mapping[str, float | None], pl: str) -> str:
        v = g.get(pl)
        return "-" if v is None else f"{pct(v)} ({abs(v - published[pl]) * 100:.1f})"

    out = ["| run | PM-First vs packed (points from published) | PAL vs packed (points from published) |",
           "|---|---:|---:|"]
    for mode, g in geo.items():
        out.append(f"| {titles[mode]} | {cell(g, 'pm-first')} | {cell(g, 'pal')} |")
    out.append(f"| PAL's paper (published) | {pct(published['pm-first'])} | {pct(published['pal'])} |")
    out.append("")
    return out


FIDELITY_NOTES = """Where the simulation differs from Pollux's simulator, and in which direction:

* **Slurm starts a job when it arrives or when another ends**; Pollux's simulator only at its
  60 s rounds. Short jobs (ncf: about a minute of work) finish sooner here (less waiting).
* **Job shapes are Slurm's** at `--granularity node` (this section): a job asks for N nodes x G
  GPUs, the same G on each node (6 GPUs on 4-GPU nodes: 2 x 3); Pollux's simulator packs 6 GPUs
  as 4 + 2. Step times come from the same measured traces, interpolated for the placement the
  job really has.
* **Preemption** is Tiresias' (a demoted job is checkpointed, requeued and held until the policy
  gives it GPUs again), costing the same 30 s restart as in Pollux's simulator; which job is
  preempted follows our Tiresias (`hpcsched/policies/tiresias.py`), not a line-by-line copy.
"""

GRID_NOTES = """Notes. `gpu`: plans speak GPUs per node and a job may hold any count per node
(4 + 2), as in Pollux's simulator, made real by the daemon's rules (starts at a job's fewest
GPUs, grows by extension, shrinks by release: `hpcsched/policies/realise.py`), what the daemon
runs by default; `node`: jobs are whole nodes x the GPUs per node they were submitted with, the
daemon's `granularity = "node"` for sites that forbid extension jobs (`docs/simulator.md`). A restart is a
start after the first or a requeue; a flip-flop is a resize undone by the job's next resize
within two rounds (`hpcsched.sim.report.flip_flops`), counted per run (160 jobs at load 1.0).
Pollux's published figures come from its own simulator (github.com/petuum/adaptdl, branch
`osdi21-artifact`), p99 as numpy's 99th percentile of each workload's JCTs, averaged over the
workloads like ours. The "sim wall time" column was measured with simulations sharing the
machine's cores; `benchmarks/sim_walltime.py` measures one at a time.
"""

PAL_NOTES = """How the two ways differ, and what remains between PAL's way and PAL's figures:

* **Slowdowns.** PAL's way: `SimConfig.variability = "pal"`
  (`hpcsched.sim.physics.pal_gpu_slowdowns`): every GPU gets, per class, an independent draw
  over all Longhorn runs of that class (run / median run), in the order and with the seed (42,
  Python's `random`) of the newest `blox/cluster_state.py` in PAL's repository, so the cluster
  is the one that code simulates, GPU for GPU. Ours: one draw per GPU
  shared by the classes, from the per-GPU *slowest* run (heavier tails for class A, and a GPU
  slow for one class is slow for all), seed 0. PAL's artifact does not use
  `32gpu-variability.csv` for its simulated cluster (`docs/simulator.md`, GPU variability).
* **Rounds.** PAL's way: 360 s (the artifact's `--round-duration 360`); a held job waits for the
  next round to start, and a finished job's GPUs stay idle until then. Ours: 60 s.
* **Each factor alone** (the rows after the first two): PAL's draws with 60 s rounds, our
  draws with 360 s rounds, and four ways PAL's artifact schedules that Slurm does not, each
  switched on in PAL's way:
  * **Strict FIFO.** PAL's FIFO stops at the first job it cannot place (no backfill); `static`
    admits any job that fits, as Slurm's backfill does. The row "FIFO stops at the first job"
    runs `static` with `backfill = false` (how much longer every job then waits: the line
    under the first table).
  * **Free moves.** PAL and PM-First in the artifact re-place every running job each round at
    no cost; here moving a running job is a requeue that pays the 30 s restart, and reconcile
    weighs it. The row "moving a running job is free" sets the restart cost to 0 s.
  * **Soft consolidation.** PAL's Packed-Sticky baseline (artifact
    `placement/packing_sticky.py`), when no node has enough free GPUs, spreads a job over the
    nodes with the most free GPUs and pays the 1.7 locality penalty; on Slurm a job keeps its
    shape (a 2-GPU job is one node x 2 GPUs, never 1 + 1) and waits. The row "packed spreads a
    job" runs the packed baseline with `SimConfig.soft_consolidate` (`hpcsched simulate
    --soft-consolidate`): a PAL job that cannot get its shape takes any free GPUs, best fit,
    else the nodes with the most free GPUs; PM-First and PAL keep the shapes as in the first
    row, so the row shows what the baseline's spreading alone does to the comparison.
  * **GPUs, not nodes.** PAL's simulator places a job on individual GPUs; Slurm gives a job a
    node's GPUs by number, so our placements choose nodes and count a node as fast as its
    slowest GPU for the class. The row "PM-First and PAL take the GPUs of their nodes that
    are fastest" lets them, once their nodes are chosen, take each node's fastest free GPUs
    for the job's class (`SimConfig.fastest_gpus`, `hpcsched simulate --fastest-gpus`);
    packed keeps the lowest-numbered. Which nodes they choose is unchanged: choosing nodes by
    their fastest free GPUs would need the free GPUs by number, which Slurm does not report.
* **PAL's simulator, rebuilt** (the rows "PAL's simulator rebuilt"; `benchmarks/pal_artifact.py`,
  a few seconds, its docstring cites the artifact file for each rule). The same traces, GPUs,
  per-class draws (seed 42) and fixed work, under the rules of the artifact's own simulator:
  * every placement picks individual GPUs anywhere in the cluster, so a 2-GPU job may run as
    1 + 1 and pay the 1.7 locality penalty;
  * FIFO stops at the first job it cannot place;
  * PM-First and PAL take every running job off each round and re-place them, class A first,
    at no cost;
  * Packed-Sticky keeps running jobs where they are, places a waiting job whole on one node if
    it can and spreads it if not, and preempts later jobs to place the head of the queue;
  * a finish counts at the round start after it.

  Under those rules the published figures come back (the first "rebuilt" row). Switching one
  rule, backfill, takes them to the second row, about where hpcsched's simulator is PAL's way.
  So the gap between PAL's way here and the published figures is the queue, not the placement
  code. Under strict FIFO a job that cannot be placed holds back every job behind it, queueing
  dominates every JCT, and a placement that runs jobs a few percent faster drains that queue
  sooner, which compounds. Slurm backfills, and so do hpcsched's runs. Strict FIFO in
  hpcsched's simulator (the row "FIFO stops at the first job") does not show the effect,
  because there jobs keep Slurm's shapes: a 2-GPU job waits for one node with 2 free GPUs,
  so fragmentation blocks the queue under every placement alike. Packed-Sticky's preemption
  changes nothing under strict FIFO (`benchmarks/pal_artifact.py --no-preempt`: same figures),
  since the jobs behind the head only run when the head does. Trace by trace the rebuilt
  figures are not all inside PAL's published per-trace range (above): what matches is the
  geomean the paper reports.
* **Per-trace results swing widely** (one trace can show a large gain where another shows a
  loss; the tables above), so the geomean of eight traces moves by several points with the draw.
"""


def load1_table(rows: Sequence[tuple[str, str]],
                figures: Mapping[tuple[str, str], Mapping[str, float | None]]) -> list[str]:
    """At load 1.0, per (policy, granularity): median JCT, GPU utilization, flip-flop fraction,
    the simulator's wall time (means over the workloads)."""
    out = ["**Other figures at load 1.0** (mean over workloads)\n",
           "| policy | granularity | median JCT | GPU utilization | resizes per run | flip-flops / resizes "
           "| sim wall time (s) |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for p, g in rows:
        f = figures[(p, g)]
        out.append(f"| `{p}` | {g} | {fmt(f['median_jct'])} | {fmt(f['gpu_utilization'], '.1%')} | "
                   f"{fmt(f['resizes'], '.1f')} | {fmt(f['flip_flop_fraction'], '.1%')} | "
                   f"{fmt(f['wall_seconds'], '.1f')} |")
    out.append("")
    return out


def grow_section(heading: str, means: Mapping[tuple[str, str, str], float | None], modes: Sequence[str],
                 loads: Sequence[str], wls: Sequence[int], cmd: str, n_runs: int, wall: float, date: str,
                 params: Mapping, policy: str) -> list[str]:
    """Section 5 (issue 10): the default policy with grows by extension and by requeue, per load:
    mean average and p99 JCT, the change extension makes, restarts per job and resizes per run.
    ``means[(metric, mode, load)]``; ``params``: an extension run's parameters (its costs are
    printed)."""
    out = [f"{heading}\n",
           f"Generated by `{cmd}` on {date} ({n_runs} simulations in {wall / 60:.1f} min; this "
           "section only: the runs by extension have the settings of section 2's `jct` runs at `gpu` "
           "granularity, and are the same simulations when both sections come from the same code, "
           "`benchmarks/_run_cache.py`). "
           f"`{policy}` (the default policy), `gpu` granularity, Pollux workloads {wls[0]}-{wls[-1]}, "
           "means over the workloads of each run's figure. **By extension** (`--grow extension`, "
           "the simulator's default): an extension Slurm job takes the new GPUs at the decision, the "
           f"job trains on at its old size for {params['extension_startup']:g} s while the new "
           f"workers start, every rank stalls {params['extension_stall']:g} s while the group "
           "re-forms, then it runs at its new size (`hpcsched/model/snapshot.py` says where "
           "these figures come from). **By requeue** (`--grow requeue`): the job gives its GPUs "
           "back and restarts at the new size, paying the "
           f"{dict(params['restart_cost']).get('*', 30.0):g} s restart. Reconcile and "
           "`jct` price a grow with the cost of the mode in force "
           "(`hpcsched.model.snapshot.grow_cost`); starts, preemptions and shrinks cost the same "
           "in both.\n"]
    for metric, title, spec in (("avg_jct", "Average JCT (s)", ".0f"), ("p99_jct", "p99 JCT (s)", ".0f"),
                                ("restarts_per_job", "Restarts per job", ".2f"),
                                ("resizes", "Resizes per run", ".0f")):
        out += [f"**{title}**\n", "| grow | " + " | ".join(f"load {ld}" for ld in loads) + " |",
                "|---|" + "---:|" * len(loads)]
        for mode in modes:
            out.append(f"| {mode} | " + " | ".join(fmt(means.get((metric, mode, ld)), spec) for ld in loads) + " |")
        if metric in ("avg_jct", "p99_jct") and {"extension", "requeue"} <= set(modes):
            rel = [None if not means.get((metric, "requeue", ld)) or means.get((metric, "extension", ld)) is None
                   else means[(metric, "extension", ld)] / means[(metric, "requeue", ld)] - 1 for ld in loads]
            out.append("| extension vs requeue | " + " | ".join(pct(r) for r in rel) + " |")
        out.append("")
    out.append(GROW_NOTES)
    return out


GROW_NOTES = """Reading. What cheaper grows do to the average JCT is the "extension vs requeue" row above; on
the code of 2026-11-24, before `jct`'s speedups over the fair share and reconcile's
admission-room fix, that row read +0.6% to +5.1% at every load. `jct` makes more resizes when
they cost less (the tables above), and not all the gains it predicts come true. Measured beside
the run of 2026-11-24 (`hpcsched simulate`, workload 3 at load 2.0, `jct`, `gpu`; extension at
the earlier provisional 8 s start-up and 1.5 s stall): by requeue at 30 s, 4,556 s average JCT;
by requeue at a 1.5 s restart, 4,762 s; by extension, 4,835 s; by extension at 0 s start-up and
stall, 4,739 s. So the restart cost also damps the policy's mistakes, and a cheaper mechanism
needs a policy whose gain estimates are right, or a gate (reconcile's `min_gain`, `horizon`,
`hold_rounds`) set for it. An extension also keeps the job's GPUs and adds others, so a grown
job spans more nodes more often than after a requeue, which re-packs it (`docs/simulator.md`).
"""


def section_of(doc: str, heading: str) -> str:
    """The section of ``doc`` that starts at the line ``heading``, up to the next ``## ``
    heading or the end (``""``: none)."""
    start = doc.find(heading + "\n")
    if start < 0:
        return ""
    end = doc.find("\n## ", start + len(heading))
    return (doc[start:end] if end >= 0 else doc[start:]).rstrip("\n") + "\n"


def replace_section(doc: str, heading: str, section: Sequence[str]) -> str:
    """``doc`` with the section that starts at the line ``heading`` (up to the next ``## ``
    heading or the end) replaced by ``section``'s lines, or ``section`` appended when ``doc``
    has none. The rest of ``doc`` is kept byte for byte."""
    text = "\n".join(section).rstrip("\n") + "\n"
    start = doc.find(heading + "\n")
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + text
    end = doc.find("\n## ", start + len(heading))
    return doc[:start] + text + (doc[end:] if end >= 0 else "")


def write_section(doc: Path, heading: str, section: Sequence[str]) -> None:
    """Write ``section`` into the document at ``doc`` (created if missing) in place of its
    section ``heading``, or at its end (:func:`replace_section`)."""
    doc.write_text(replace_section(doc.read_text() if doc.exists() else "", heading, section))
