"""Every Slurm text format hpcsched reads, parsed without calling Slurm (pure).

* ``squeue --json`` -> ``{job_id: JobInfo}`` (:func:`parse_squeue_json`),
* ``sinfo --json`` -> ``(NodeView, ...)`` (:func:`parse_sinfo_json`),
* the planned nodes of pending jobs, ``squeue -o %i|%Y`` (:func:`parse_scheduled_nodes`),
* GPU counts through :func:`hpcsched.slurm.gres.gpu_count`, the one GRES/TRES parser,
* ``slurm_job_<id>_resize.sh`` (:func:`parse_resize_script`, in
  :mod:`hpcsched.slurm.resize_script`; imported here too).

What Slurm 22.05.8 really prints (measured on the dev cluster, ``hpcsched devcluster up``;
``docs/slurm-22.05-notes.md`` §3)::

    sinfo --json -> {"meta": {...}, "errors": [], "nodes": [{
        "name": "n1", "state": "mixed", "state_flags": [],          # flags e.g. ["DRAIN"]
        "gres": "gpu:4",                                             # configured
        "gres_used": "gpu:2",     # allocated; "gpu:0" when idle, no "(IDX:...)" suffix in 22.05
        "gres_drained": "N/A", "partitions": ["gpu"],
        "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4",
        "tres_used": "cpu=2,gres/gpu=2",                             # null when idle
        ...}]}
    squeue --json -> {"meta": {...}, "errors": [], "jobs": [{"job_id": 55, "job_state": "RUNNING",
        "nodes": "n[1-3]", "node_count": 3, "tres_per_node": "gres:gpu:2",
        "gres_detail": ["gpu:2(IDX:0-1)", ...], ...}]}   # every job slurmctld still holds

Slurm 23.02 and later (data_parser v0.0.40+; recorded from 24.11.5 and 26.05.5 in
``tests/data/slurm/<version>/``, compared in ``docs/slurm-versions.md``) differ in four ways,
each read by one small accessor on one code path:

* version fields: ``meta.plugin.data_parser`` ``"data_parser/v0.0.42"`` and ``meta.slurm.release``
  instead of ``meta.plugin.type`` ``"openapi/v0.0.38"`` and ``meta.Slurm.release``
  (:func:`doc_version`);
* numbers such as ``node_count``, ``priority``, ``cpus``, ``tasks``, ``cpus_per_task`` are
  ``{"set": true, "infinite": false, "number": 2}`` (:func:`_int`);
* ``job_state`` and node ``state`` are lists, ``["RUNNING"]``, ``["MIXED", "DRAIN"]``
  (:func:`_job_state`, :func:`node_state`); ``tres_per_node`` is ``"gres/gpu:2"``;
* ``sinfo --json`` lists groups of like nodes under ``"sinfo"`` (``nodes.nodes`` names,
  ``node.state``, ``gres.total``/``gres.used``, ``partition.name``) instead of one object per node
  under ``"nodes"`` (:func:`_sinfo_entry_nodes` turns each group into 22.05-shaped nodes).

Units: GPU counts are GPUs per node; times are Unix seconds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcsched.model.snapshot import NodeView
from hpcsched.protocol.kinds import SlurmState
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable, says_unreachable
from hpcsched.slurm.gres import NO_VALUE, gpu_count, gpu_indexes
from hpcsched.slurm.resize_script import parse_resize_script as parse_resize_script

#: Job states in which Slurm still holds resources for the job or may start it again.
ACTIVE_STATES = SlurmState.ACTIVE


@dataclass(frozen=True)
class JobInfo:
    """One job as ``squeue --json`` reports it (fields we use; times in Unix seconds)."""

    job_id: str
    name: str
    user: str
    state: str              # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ...
    state_reason: str
    partition: str
    nodes: str              # Slurm hostlist expression, "" while pending
    node_count: int
    gpus_per_node: int      # gpu_count(tres_per_node), e.g. "gres:gpu:4" -> 4 (0 if none)
    restarts: int
    batch_host: str
    priority: int
    cpus_per_task: int = 1  # from cpus / tasks: 22.05's JSON leaves cpus_per_task null
    comment: str = ""       # --comment (an extension job's tag: hpcsched.protocol.extensions)
    admin_comment: str = ""  # AdminComment: slurm-plugins/job_submit.lua's tag ("hpcsched:...")
    submit_time: float | None = None   # the latest submission (a requeue rewrites it); unset: None
    start_time: float | None = None    # the latest start
    end_time: float | None = None      # the end, or (while active) the time limit's
    account: str = ""       # Slurm account (-A), for the daemon's exclusions
    qos: str = ""           # QOS (--qos)
    #: a pending job's nodes as Slurm's backfill plans them, a hostlist (``squeue -o %Y``,
    #: SchedNodes; ``scheduled_nodes`` in 23.02+'s JSON): "" none planned; None: this
    #: ``squeue --json`` does not report them (Slurm 22.05, :func:`parse_scheduled_nodes`)
    scheduled_nodes: str | None = None
    #: the GPU indexes it holds on each node of ``nodes`` (expanded, in order), from
    #: ``gres_detail``'s ``(IDX:...)`` lists; empty: not known (pending, or not reported)
    gpu_index: tuple[tuple[int, ...], ...] = ()

    @property
    def active(self) -> bool:
        """Slurm still holds or may (re)start this job: see :data:`ACTIVE_STATES`."""
        return self.state in ACTIVE_STATES


# --------------------------------------------------------------------------------------------
# --json documents
# --------------------------------------------------------------------------------------------


def _mapping(value: object) -> Mapping:
    """``value`` if it is a JSON object, else an empty one (a field missing or of another type)."""
    return value if isinstance(value, Mapping) else {}


def doc_version(doc: Mapping) -> tuple[str, int]:
    """``(release, data parser version)`` of a ``--json`` document from its own ``meta``:
    ``("22.05.8", 38)`` from ``meta.Slurm.release`` and ``meta.plugin.type`` ``"openapi/v0.0.38"``;
    ``("24.11.5", 42)`` from ``meta.slurm.release`` and ``meta.plugin.data_parser``
    ``"data_parser/v0.0.42"``. ``("", 0)`` for a field that is missing (hand-made documents)."""
    meta = _mapping(doc.get("meta"))
    slurm = _mapping(meta.get("slurm") or meta.get("Slurm"))
    plugin = _mapping(meta.get("plugin"))
    m = re.search(r"v0\.0\.(\d+)", str(plugin.get("data_parser") or plugin.get("type") or ""))
    return str(slurm.get("release") or ""), int(m.group(1)) if m else 0


#: The first data parser (Slurm 23.02) whose ``sinfo --json`` groups nodes under ``"sinfo"``.
DATA_PARSER_GROUPED = 40


def _doc_key(doc: dict, key: str) -> str:
    """The key of the list to read: for ``nodes`` of a data-parser document (v0.0.40+), the
    ``sinfo`` groups; a document without version fields is read by the key it has."""
    if key == "nodes" and "sinfo" in doc and (doc_version(doc)[1] >= DATA_PARSER_GROUPED or key not in doc):
        return "sinfo"
    return key


def _load_doc(text: object, what: str, key: str, object_pairs_hook=None) -> tuple[str, list[dict]]:
    """Decode a ``--json`` document (``object_pairs_hook``: :func:`json.loads`'s, e.g.
    :func:`_slim_job`); return (the key read, its list), or raise SlurmError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise SlurmError(f"{what}: expected text, got {type(text).__name__}")
    try:
        doc = json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        tail = "(empty)" if not text.strip() else f"(at char {exc.pos} of {len(text)})"
        raise SlurmError(f"{what}: output is not valid JSON, truncated? {tail}: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: expected a JSON object at top level, got {type(doc).__name__}")
    key = _doc_key(doc, key)
    if doc.get("errors"):
        raise _reported_error(what, doc["errors"], doc.get(key))
    if key not in doc:
        raise SlurmError(f"{what}: no {key!r} in the output (keys: {sorted(doc)[:8]})")
    items = doc[key]
    if not isinstance(items, list):
        raise SlurmError(f"{what}: {key!r} should be a list, got {type(items).__name__} {items!r:.80}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SlurmError(f"{what}: {key}[{i}] should be an object, got {item!r:.80}")
    return key, items


def _error_text(e: object) -> tuple[str, bool]:
    """One entry of a document's ``errors`` list: (its text, whether it says unreachable)."""
    if not isinstance(e, dict):
        return str(e), says_unreachable(e)
    num = e.get("error_number", e.get("errno"))
    text = "; ".join(str(e[k]) for k in ("source", "description", "error") if e.get(k))
    text += f" (errno {num})" if num is not None else ""
    src = str(e.get("source") or "")
    return text, num == -1 or src.startswith("slurm_load_") or says_unreachable(e)


def _reported_error(what: str, errors: object, items: object) -> SlurmError:
    """The exception for a document whose ``errors`` list is not empty.

    Measured on 22.05.8: with the controller unreachable, ``squeue --json`` and ``sinfo --json``
    exit **0** after about 9 s (the client's connect retries), print nothing on stderr, and print
    ``{"errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}`` (sinfo) or
    ``{"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
    "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}`` (squeue). Taking
    that for "no jobs, no nodes" would be a disaster, so any error fails the observation: with no
    data and an unspecified error (errno -1) or a failed ``slurm_load_*``, it is
    :class:`SlurmUnavailable`; otherwise :class:`SlurmError`.
    """
    parsed = [_error_text(e) for e in (errors if isinstance(errors, list) else [errors])]
    msg = f"{what} reported errors: {' | '.join(t for t, _ in parsed)[:300]}"
    if any(u for _, u in parsed) and not items:
        return SlurmUnavailable(msg + " (the controller did not answer?)")
    return SlurmError(msg)


# --------------------------------------------------------------------------------------------
# squeue --json
# --------------------------------------------------------------------------------------------


def _int(value: object) -> int:
    """A JSON number of any version: ``2`` (22.05), ``{"set": true, "infinite": false, "number": 2}``
    (data_parser v0.0.40+); unset, infinite or null -> 0.

    Raises:
        TypeError, ValueError: anything else (the callers turn them into SlurmError).
    """
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return 0
        value = value.get("number")
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got {value!r}")
    if not value:            # null, 0, "" (and, as ever, an empty list or object)
        return 0
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number, got {value!r:.80}")
    return int(value)


#: Flags that 22.05 prints instead of the base state, in its order of precedence
#: (``job_state_string()`` in Slurm's src/common/slurm_protocol_defs.c); v0.0.40+ lists them
#: beside the base state, ``["RUNNING", "COMPLETING"]``.
_STATE_FLAGS = (SlurmState.COMPLETING, SlurmState.STAGE_OUT, SlurmState.CONFIGURING, SlurmState.RESIZING,
                SlurmState.REQUEUED, SlurmState.REQUEUE_FED, SlurmState.REQUEUE_HOLD, SlurmState.SPECIAL_EXIT,
                SlurmState.STOPPED, SlurmState.REVOKED, SlurmState.RESV_DEL_HOLD, SlurmState.SIGNALING)


def _job_state(j: dict) -> str:
    """``job_state`` as 22.05 prints it: a string there; from a v0.0.40+ list the flag 22.05
    would show (:data:`_STATE_FLAGS`, ``["RUNNING", "COMPLETING"]`` -> ``COMPLETING``), else the
    base state (the first entry)."""
    state = j.get("job_state") or ""
    if isinstance(state, list):
        words = [str(w) for w in state]
        state = next((f for f in _STATE_FLAGS if f in words), words[0] if words else "")
    return str(state)


def _cpus_per_task(j: dict) -> int:
    """``cpus_per_task``, else ``cpus // tasks`` (22.05 leaves cpus_per_task null), at least 1."""
    if _int(j.get("cpus_per_task")):
        return max(1, _int(j["cpus_per_task"]))
    return max(1, _int(j.get("cpus")) // max(1, _int(j.get("tasks")) or 1))


def _gpus_per_node(j: dict) -> int:
    """A job's GPUs per node: for a running job what it was allocated (``gres_detail``, one
    ``gpu:3(IDX:0-2)`` per node, the most of them), else what it asks (``tres_per_node``). The
    two differ when the request changed after the allocation: ``scontrol update TresPerNode``
    on a pending job that Slurm starts in the same instant leaves the running job asking 1 GPU
    per node and holding 3 (seen on the dev cluster, Slurm 22.05)."""
    detail = j.get("gres_detail")
    if _job_state(j) == SlurmState.RUNNING and isinstance(detail, list) and detail:
        try:
            held = max(gpu_count(d) for d in detail if isinstance(d, str))
        except (SlurmError, ValueError):   # no string entries, or one that does not parse
            held = 0
        if held:
            return held
    return gpu_count(j.get("tres_per_node"))


#: The fields of a ``squeue --json`` job that :func:`_job_from_json` and its helpers read: of the
#: 110-111 (22.05) to 137 (26.05) a job has, the rest are dropped as the document is decoded
#: (:func:`_slim_job`).
JOB_FIELDS = frozenset({
    "job_id", "name", "user_name", "user_id", "job_state", "state_reason", "partition", "nodes",
    "node_count", "gres_detail", "tres_per_node", "restart_cnt", "batch_host", "priority",
    "cpus_per_task", "cpus", "tasks", "comment", "admin_comment", "submit_time", "start_time",
    "end_time", "account", "qos", "scheduled_nodes"})


def _slim_job(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s ``object_pairs_hook`` for ``squeue --json``: a job object (it has
    ``job_id`` and ``job_state``) keeps only :data:`JOB_FIELDS`, any other object all of its
    keys. Each job's other fields (and their nested objects) are freed as soon as the job is
    decoded, so the decoded document stays a fraction of its full size, and so does the peak
    while decoding (``benchmarks/squeue_parse.py``; figures in ``docs/daemon.md``, "Memory")."""
    d = dict(pairs)
    if "job_id" in d and "job_state" in d:
        return {k: v for k, v in pairs if k in JOB_FIELDS}
    return d


def _gpu_index(j: dict) -> tuple[tuple[int, ...], ...]:
    """The GPU indexes a job holds per node (``gres_detail``: one ``gpu:2(IDX:0-1)`` per node of
    its list), or ``()`` when an entry lacks them or does not parse: unknown, never a guess."""
    detail = j.get("gres_detail")
    if not isinstance(detail, list) or not detail:
        return ()
    out = []
    for d in detail:
        try:
            idx = gpu_indexes(d) if isinstance(d, str) else None
        except SlurmError:
            idx = None
        if idx is None:
            return ()
        out.append(idx)
    return tuple(out)


def _job_from_json(j: dict) -> JobInfo:
    return JobInfo(
        job_id=str(j["job_id"]),
        name=str(j.get("name") or ""),
        user=str(j.get("user_name") or j.get("user_id") or ""),
        state=_job_state(j),
        state_reason=str(j.get("state_reason") or ""),
        partition=str(j.get("partition") or ""),
        nodes=str(j.get("nodes") or ""),
        node_count=_int(j.get("node_count")),
        gpus_per_node=_gpus_per_node(j),
        restarts=_int(j.get("restart_cnt")),
        batch_host=str(j.get("batch_host") or ""),
        priority=_int(j.get("priority")),
        cpus_per_task=_cpus_per_task(j),
        comment=comment_text(j.get("comment")),
        admin_comment=comment_text(j.get("comment"), "administrator") or str(
            j.get("admin_comment") or ""),
        submit_time=_time(j.get("submit_time")),
        start_time=_time(j.get("start_time")),
        end_time=_time(j.get("end_time")),
        account=str(j.get("account") or ""),
        qos=str(j.get("qos") or ""),
        gpu_index=_gpu_index(j),
        scheduled_nodes=(_hostlist_or_empty(j["scheduled_nodes"]) if "scheduled_nodes" in j
                         else None),
    )


def _hostlist_or_empty(value: object) -> str:
    """A hostlist field: "" for Slurm's empty forms (``(null)``, ``None``, absent)."""
    text = str(value or "").strip()
    return "" if text.lower() in NO_VALUE else text


def _time(value: object) -> float | None:
    """An epoch time (s) of any version (:func:`_int`'s forms); None when unset (0, ``set:
    false``, infinite) or malformed: no caller needs a job's times to manage it."""
    try:
        t = _int(value)
    except (TypeError, ValueError):
        return None
    return float(t) if t > 0 else None


def comment_text(value, which: str = "job") -> str:
    """The job's ``--comment``: a string in 22.05; ``{"job": ..., "administrator": ...,
    "system": ...}`` from 23.02 (openapi v0.0.39+). ``which="administrator"``: the
    AdminComment of 23.02+ (22.05 gives it as ``admin_comment``; then "")."""
    if isinstance(value, dict):
        return str(value.get(which) or "")
    return str(value or "") if which == "job" else ""


def parse_squeue_json(text: str | bytes) -> dict[str, JobInfo]:
    """Parse ``squeue --json`` output (Slurm 22.05, 24.11, 26.05: see the module docstring) into
    ``{job_id: JobInfo}``. 22.05 lists every job slurmctld holds; 23.02+ only the states of
    squeue's default filter unless run with ``-t all`` (``docs/slurm-versions.md``).

    Raises:
        SlurmUnavailable: the document reports that the controller could not be reached (22.05
            then exits 0 with an empty list: see :func:`_reported_error`).
        SlurmError: anything else that is not the JSON squeue documents (e.g. truncated).
    """
    _, jobs = _load_doc(text, "squeue --json", "jobs", object_pairs_hook=_slim_job)
    out = {}
    for i, j in enumerate(jobs):
        if j.get("job_id") is None:
            raise SlurmError(f"squeue --json: jobs[{i}] has no job_id: {j!r:.120}")
        try:
            info = _job_from_json(j)
        except (TypeError, ValueError, AttributeError) as exc:
            raise SlurmError(f"squeue --json: jobs[{i}]: unexpected value ({exc})") from exc
        out[info.job_id] = info
    return out


#: ``squeue`` arguments for the planned nodes of pending jobs (:func:`parse_scheduled_nodes`)
SCHEDULED_NODES_ARGS = ("squeue", "-h", "-t", "PENDING", "-o", "%i|%Y")


def parse_scheduled_nodes(text: str) -> dict[str, str]:
    """Parse ``squeue -h -t PENDING -o "%i|%Y"`` (:data:`SCHEDULED_NODES_ARGS`) into
    ``{job_id: hostlist}`` for the pending jobs backfill has planned onto nodes (squeue(1),
    ``%Y``: "For pending jobs, a list of the nodes expected to be used when the job is
    started"); jobs without a plan (``(null)``) are left out. Slurm 22.05's ``squeue --json``
    has no such field; 23.02+ give it as ``scheduled_nodes``.

    Raises:
        SlurmError: a line that is not ``<job id>|<hostlist>``.
    """
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, sep, nodes = line.strip().partition("|")
        if not sep or not job_id[:1].isdigit():   # 12, 12_3 (array), 12+0 (heterogeneous)
            raise SlurmError(f"squeue -o '%i|%Y': unexpected line {line!r:.120}")
        if nodes := _hostlist_or_empty(nodes):
            out[job_id] = nodes
    return out


# --------------------------------------------------------------------------------------------
# sinfo --json
# --------------------------------------------------------------------------------------------


def _state_words(state: object) -> list[str]:
    if isinstance(state, list):
        return [str(s) for s in state]
    if isinstance(state, str):
        return [w for w in state.split("+") if w]
    if state is None:
        return []
    raise SlurmError(f"node state: expected a string or list, got {state!r:.80}")


def node_state(state: object, flags: object) -> str:
    """``"idle"``, ``"mixed+drain"``, ``"down+not_responding"``: base state and flags, lower
    case, joined by ``+`` (the form ``scontrol show node`` prints, lowered). 22.05 gives the
    base state as a string and the flags as a list; later openapi versions give one list, and
    pyslurm gives ``"IDLE+DRAIN"``.

    Raises:
        SlurmError: ``state`` is not a string, list or None, or ``flags`` not a list or None.
    """
    words = _state_words(state)
    if flags is not None:
        if not isinstance(flags, list):
            raise SlurmError(f"node state_flags: expected a list, got {flags!r:.80}")
        words += [str(f) for f in flags]
    out: list[str] = []
    for w in (w.strip().lower() for w in words):
        if w and w not in out:
            out.append(w)
    return "+".join(out) or "unknown"


def name_list(value: object, what: str) -> tuple[str, ...]:
    """A list of names from a JSON list of strings or a comma-separated string (``None`` -> ()).

    Raises:
        SlurmError: anything else (``what`` names the field in the message).
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(p for p in (s.strip() for s in value.split(",")) if p)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SlurmError(f"{what}: expected a list of names, got {value!r:.80}")


def _has_value(text: object) -> bool:
    return isinstance(text, str) and text.strip().lower() not in NO_VALUE


def _node_from_json(n: dict, i: int) -> NodeView:
    name = n.get("name") or n.get("hostname")
    if not isinstance(name, str) or not name:
        raise SlurmError(f"sinfo --json: nodes[{i}] has no name: {n!r:.120}")
    used = n.get("gres_used")
    return NodeView(
        name=name,
        gpus=gpu_count(n.get("gres")),
        gpus_allocated=gpu_count(used if _has_value(used) else n.get("tres_used")),
        state=node_state(n.get("state"), n.get("state_flags")),
        partitions=name_list(n.get("partitions"), f"sinfo --json: nodes[{i}].partitions"),
    )


def _sinfo_entry_nodes(e: dict, i: int) -> list[dict]:
    """One group of a v0.0.40+ ``sinfo --json`` (nodes alike in state, GRES use and partition)
    as one 22.05-shaped node object per name in ``nodes.nodes``.

    Raises:
        SlurmError: the group has no ``nodes.nodes`` list of names.
    """
    names = _mapping(e.get("nodes")).get("nodes")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SlurmError(f"sinfo --json: sinfo[{i}] has no nodes.nodes list: {e!r:.120}")
    gres = _mapping(e.get("gres"))
    part = _mapping(e.get("partition"))
    node = _mapping(e.get("node"))
    common = {"state": node.get("state"), "gres": gres.get("total"), "gres_used": gres.get("used"),
              "partitions": [part["name"]] if part.get("name") else []}
    return [dict(common, name=name) for name in names]


def parse_sinfo_json(text: str | bytes) -> tuple[NodeView, ...]:
    """Parse ``sinfo --json`` (sinfo(1) ``--json``; Slurm 22.05 openapi v0.0.38 and 23.02+ data
    parser v0.0.40+, whose groups of like nodes are read by :func:`_sinfo_entry_nodes`) into nodes.

    Per node: ``name`` (``hostname`` if missing), ``gpus`` from ``gres``, ``gpus_allocated``
    from ``gres_used`` (falling back to ``tres_used`` ``gres/gpu=N``, then 0), all through
    :func:`gpu_count`; ``state`` from ``state`` + ``state_flags`` (see :func:`node_state`),
    ``partitions``. A node listed more than once (once per partition) is merged: one
    :class:`NodeView`, partitions united, in first appearance order. Missing optional fields
    default to 0 / ``"unknown"`` / ``()``.

    Raises:
        SlurmUnavailable: the document reports that the controller could not be reached.
        SlurmError: not JSON (e.g. truncated), no ``nodes`` list, a node that is not an object
            or has no name, or a field of the wrong type.
    """
    merged: dict[str, NodeView] = {}
    key, items = _load_doc(text, "sinfo --json", "nodes")
    if key == "sinfo":
        items = [n for i, e in enumerate(items) for n in _sinfo_entry_nodes(e, i)]
    for i, n in enumerate(items):
        node = _node_from_json(n, i)
        old = merged.get(node.name)
        if old is not None:
            parts = old.partitions + tuple(p for p in node.partitions if p not in old.partitions)
            node = NodeView(old.name, max(old.gpus, node.gpus),
                            max(old.gpus_allocated, node.gpus_allocated), old.state, parts)
        merged[node.name] = node
    return tuple(merged.values())


def duration_seconds(text: str) -> float:
    """Seconds in a Slurm duration as ``squeue -o %L`` prints it: ``[days-]hours:minutes:seconds``
    or ``minutes:seconds`` (squeue(1), "%L").

    Raises:
        ValueError: not such a duration.
    """
    days, sep, clock = text.strip().rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        whole_days = int(days) if sep else 0
    except ValueError:
        raise ValueError(f"not a Slurm duration: {text!r}") from None
    if not 2 <= len(parts) <= 3 or any(p < 0 for p in parts) or whole_days < 0:
        raise ValueError(f"not a Slurm duration: {text!r}")
    h, m, sec = ([0] * (3 - len(parts)) + parts)
    return float((whole_days * 24 + h) * 3600 + m * 60 + sec)
