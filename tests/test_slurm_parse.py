"""Tests for ``hpcsched.slurm.parse``: every Slurm text format hpcsched reads, without Slurm.

Parsing tests run on output captured from the dev cluster (``tests/slurm_outputs.py``), plus
malformed inputs that must raise ``SlurmError``. The GPU-count table lists every GRES/TRES form
with the count Slurm means and where that rule comes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcsched.model.snapshot import NodeView
from hpcsched.slurm import SlurmError, SlurmUnavailable, parse
from hpcsched.slurm.gres import gpu_count
from hpcsched.slurm.observe import PyslurmBackend
from hpcsched.slurm.parse import (
    doc_version,
    node_state,
    parse_resize_script,
    parse_scheduled_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)
from tests.slurm_outputs import (
    SINFO_DOWN,
    SINFO_IDLE,
    SINFO_RUNNING,
    SQUEUE_CANCELLED,
    SQUEUE_DOWN,
    SQUEUE_RUNNING,
    node,
    sinfo,
)

# --------------------------------------------------------------------------------------------
# GPUs in a GRES/TRES string: every form, its count, and the source of the rule
# --------------------------------------------------------------------------------------------

GPU_FORMS = [
    # no GPUs
    (None, 0),                                      # JSON null (tres_used when idle, measured)
    ("", 0),                                        # tres_per_node of a job without GRES (measured)
    ("(null)", 0),                                  # sinfo gres of a node without GRES
    ("N/A", 0),                                     # gres_drained (measured)
    ("gpu:0", 0),                                   # gres_used when idle (measured, 22.05)
    ("shard:8", 0),                                 # other GRES are not GPUs
    ("cpu=2,gres/gpumem=16G", 0),                   # a GRES whose name only starts with gpu
    # GRES form: name[:type][:count], count omitted = 1 (sbatch(1) --gres)
    ("gpu:4", 4),                                   # sinfo gres (measured)
    ("gres:gpu:4", 4),                              # squeue tres_per_node (measured, 22.05)
    ("gres/gpu:4", 4),                              # tres_per_node in later versions
    ("gres:gpu", 1),                                # --gres=gpu: "a default value of 1"
    ("gres/gpu", 1),
    ("gpu", 1),
    ("gpu:a100", 1),                                # typed, count omitted
    ("gpu:a100:4", 4),
    ("gres:gpu:a100:2", 2),
    ("gpu:2K", 2048),                               # K/M/G suffix, x1024 (sbatch(1) --gres)
    ("gpu:a100:no_consume:2", 2),                   # slurm.conf(5) Gres=name[:type][:no_consume]:count
    # index and socket suffixes
    ("gpu:2(IDX:0-1)", 2),                          # gres_detail (measured)
    ("gpu:2(IDX:0,2)", 2),                          # comma inside the index list
    ("gpu(IDX:0-3)", 4),                            # scontrol show job -d: indexes stand for the count
    ("gpu(IDX:0,2-3)", 3),
    ("gpu:a100(IDX:1)", 1),
    ("gpu(IDX:N/A)", 0),
    ("gpu:2(S:0)", 2),                              # socket suffix
    ("gpu:a100:4(S:0-1)", 4),
    ("gpu:(null):0(IDX:N/A)", 0),                   # gres_used of an idle node, some versions
    ("gpu:(null):3(IDX:0-2)", 3),
    # several entries: types add up
    ("gpu:a100:2,gpu:v100:2", 4),                   # review C3: was 2 vs 4
    ("gpu:a100:2,gpu:v100:1(IDX:3)", 3),
    ("mps:100,gpu:2", 2),
    ("gpu:2,mps:100(S:0)", 2),
    # TRES form: the untyped total is not added to typed entries (slurm.conf(5) AccountingStorageTRES)
    ("gres/gpu=4", 4),
    ("cpu=8,mem=16000M,billing=8,gres/gpu=4", 4),   # sinfo tres (measured)
    ("cpu=2,gres/gpu=2", 2),                        # sinfo tres_used (measured)
    ("cpu=2,gres/gpu=4,gres/gpu:a100=4", 4),
    ("gres/gpu:a100=4,gres/gpu=4", 4),              # order does not matter
    ("gres/gpu=4,gres/gpu:a100=2,gres/gpu:v100=2", 4),
    ("gres/gpu:a100=2,gres/gpu:v100=2", 4),         # typed only: they add up
    # pyslurm's dict form goes through the same counting
    ({}, 0),
    ({"gpu": 4}, 4),
    ({"gpu:a100": 2, "gpu:v100": "1"}, 3),
    ({"gpu": {"count": "2", "indexes": "0-1"}}, 2),
    ({"gres/gpu": 2}, 2),
    ({"mps": 100}, 0),
]


@pytest.mark.parametrize("value, want", GPU_FORMS, ids=[repr(v) for v, _ in GPU_FORMS])
def test_gpu_count(value, want):
    assert gpu_count(value) == want


@pytest.mark.parametrize("bad", [5, ["gpu:4"], "gpu:a100:four", "gpu:x:y", "gres/gpu=many",
                                 "gpu(IDX:a-b)", {"gpu": None}, {"gpu": "two"}, {"gpu": True}])
def test_gpu_count_rejects_garbage(bad):
    with pytest.raises(SlurmError):
        gpu_count(bad)


STRING_FORMS = [(v, n) for v, n in GPU_FORMS if isinstance(v, str) and v]


@pytest.mark.parametrize("value, want", STRING_FORMS, ids=[v for v, _ in STRING_FORMS])
def test_squeue_sinfo_and_pyslurm_count_alike(value, want):
    """squeue's per-job field, sinfo's per-node fields and the pyslurm mapping all use gpu_count."""
    job = json.dumps({"jobs": [{"job_id": 1, "tres_per_node": value}]})
    assert parse_squeue_json(job)["1"].gpus_per_node == want
    (n,) = parse_sinfo_json(sinfo(node(gres=value, gres_used=value)))
    assert (n.gpus, n.gpus_allocated) == (want, want)
    (n,) = parse_sinfo_json(sinfo(node(gres_used=None, tres_used=value)))
    assert n.gpus_allocated == want
    pj = SimpleNamespace(id=1, num_nodes=1, gres_per_node=value)
    assert PyslurmBackend._job(pj).gpus_per_node == want


# --------------------------------------------------------------------------------------------
# sinfo --json
# --------------------------------------------------------------------------------------------


def test_sinfo_idle():
    nodes = parse_sinfo_json(SINFO_IDLE)
    assert nodes == tuple(NodeView(f"n{k}", 4, 0, "idle", ("gpu",)) for k in range(1, 5))
    assert all(n.usable and n.gpus_free == 4 for n in nodes)


def test_sinfo_running_job():
    nodes = {n.name: n for n in parse_sinfo_json(SINFO_RUNNING)}
    assert [nodes[n].gpus_allocated for n in ("n1", "n2", "n3", "n4")] == [4, 4, 2, 0]
    assert nodes["n1"].state == "mixed" and nodes["n4"].state == "idle"
    assert nodes["n3"].gpus_free == 2


def test_sinfo_bytes_accepted():
    assert len(parse_sinfo_json(SINFO_IDLE.encode())) == 4


@pytest.mark.parametrize("state, flags, want", [
    ("idle", [], "idle"),
    ("idle", ["DRAIN"], "idle+drain"),             # sinfo's "drained"
    ("mixed", ["DRAIN"], "mixed+drain"),           # sinfo's "draining"
    ("down", ["NOT_RESPONDING"], "down+not_responding"),
    ("allocated", None, "allocated"),
    (["IDLE", "DRAIN"], None, "idle+drain"),       # later openapi versions: one list
    ("IDLE+DRAIN", [], "idle+drain"),              # scontrol / pyslurm form
    ("IDLE+DRAIN", ["drain"], "idle+drain"),       # a flag given twice is kept once
    (None, None, "unknown"),
])
def test_sinfo_state_and_flags(state, flags, want):
    (n,) = parse_sinfo_json(sinfo(node(state=state, state_flags=flags)))
    assert n.state == want == node_state(state, flags)
    assert n.usable == (want in ("idle", "allocated"))


def test_sinfo_node_listed_per_partition_is_merged():
    text = sinfo(node("n1", partitions=["gpu"]), node("n2"),
                 node("n1", partitions=["debug", "gpu"]))
    nodes = parse_sinfo_json(text)
    assert [n.name for n in nodes] == ["n1", "n2"]
    assert nodes[0].partitions == ("gpu", "debug")


def test_sinfo_missing_optional_fields_default():
    (n,) = parse_sinfo_json(sinfo({"name": "x1"}))
    assert n == NodeView("x1", 0, 0, "unknown", ())
    (n,) = parse_sinfo_json(sinfo({"hostname": "x2", "partitions": "a,b"}))
    assert n.name == "x2" and n.partitions == ("a", "b")


def test_sinfo_gres_used_missing_falls_back_to_tres_used():
    (n,) = parse_sinfo_json(sinfo(node(gres_used=None, tres_used="cpu=2,gres/gpu=3")))
    assert n.gpus_allocated == 3
    (n,) = parse_sinfo_json(sinfo(node(gres_used="N/A", tres_used=None)))
    assert n.gpus_allocated == 0


@pytest.mark.parametrize("text, what", [
    (SINFO_IDLE[: len(SINFO_IDLE) // 2], "valid JSON"),   # truncated
    ("", "valid JSON"),
    ('{"nodes": 5}', "should be a list"),
    ('{"meta": {}, "errors": []}', "no 'nodes'"),
    ("[]", "JSON object"),
    ('{"nodes": [5]}', "should be an object"),
    ('{"nodes": [{"state": "idle"}]}', "no name"),
    ('{"nodes": [{"name": "n1", "gres": 4}]}', "GRES"),
    ('{"nodes": [{"name": "n1", "gres": "gpu:x:y"}]}', "whole number"),
    ('{"nodes": [{"name": "n1", "gres_used": null, "tres_used": 3}]}', "GRES"),
    ('{"nodes": [{"name": "n1", "state_flags": "DRAIN"}]}', "state_flags"),
    ('{"nodes": [{"name": "n1", "state": 3}]}', "state"),
    ('{"nodes": [{"name": "n1", "partitions": [1, 2]}]}', "partitions"),
    ('{"errors": [{"error": "Access denied", "errno": 2010}], "nodes": []}', "Access denied"),
])
def test_sinfo_malformed_raises_slurm_error(text, what):
    with pytest.raises(SlurmError, match=what) as ei:
        parse_sinfo_json(text)
    assert not isinstance(ei.value, SlurmUnavailable)


# --------------------------------------------------------------------------------------------
# squeue --json
# --------------------------------------------------------------------------------------------


def test_squeue_running_and_held():
    jobs = parse_squeue_json(SQUEUE_RUNNING)
    assert set(jobs) == {"59", "60", "61"}
    run, held = jobs["61"], jobs["60"]
    assert (run.state, run.nodes, run.node_count, run.gpus_per_node) == ("RUNNING", "n[1-2]", 2, 2)
    assert (held.state, held.state_reason, held.nodes, held.gpus_per_node) == (
        "PENDING", "JobHeldUser", "", 0)
    assert jobs["59"].restarts == 1
    assert all(j.active for j in jobs.values())


def test_squeue_finished_jobs_listed():
    jobs = parse_squeue_json(SQUEUE_CANCELLED)
    assert {j.state for j in jobs.values()} == {"CANCELLED"}
    assert not any(j.active for j in jobs.values())


@pytest.mark.parametrize("fields, want", [
    ({}, 1),
    ({"cpus": 8, "tasks": 2}, 4),                  # 22.05: cpus_per_task is null
    ({"cpus_per_task": 3, "cpus": 8, "tasks": 2}, 3),
    ({"cpus": 1, "tasks": 4}, 1),                  # never below 1
])
def test_squeue_cpus_per_task(fields, want):
    text = json.dumps({"jobs": [{"job_id": 7, "cpus_per_task": None, **fields}]})
    assert parse_squeue_json(text)["7"].cpus_per_task == want


@pytest.mark.parametrize("fields, comment, admin", [
    ({"comment": "c", "admin_comment": "hpcsched:elastic job=x"}, "c", "hpcsched:elastic job=x"),
    ({"comment": {"job": "c", "administrator": "a", "system": ""}}, "c", "a"),   # 23.02+
    ({"comment": None, "admin_comment": None}, "", ""),
    ({}, "", ""),
])
def test_squeue_comment_and_admin_comment(fields, comment, admin):
    job = parse_squeue_json(json.dumps({"jobs": [{"job_id": 7, **fields}]}))["7"]
    assert (job.comment, job.admin_comment) == (comment, admin)


@pytest.mark.parametrize("state, reason, admin, want", [
    ("PENDING", "BeginTime", "hpcsched:elastic job=ab max_gpus=8 hold=60", True),
    ("PENDING", "BeginTime", "hpcsched:elastic job=ab max_gpus=8", False),   # the user's --begin
    ("PENDING", "Resources", "hpcsched:elastic job=ab max_gpus=8 hold=60", False),
    ("RUNNING", "None", "hpcsched:elastic job=ab max_gpus=8 hold=60", False),
    ("PENDING", "BeginTime", "site:other hold=60", False),
])
def test_held_for_placement(state, reason, admin, want):
    from hpcsched.daemon.views import held_for_placement

    text = json.dumps({"jobs": [{"job_id": 7, "job_state": state, "state_reason": reason,
                                 "admin_comment": admin}]})
    assert held_for_placement(parse_squeue_json(text)["7"]) is want


@pytest.mark.parametrize("state, want", [
    (["RUNNING"], "RUNNING"),                        # 24.11/26.05 (recorded)
    (["PENDING"], "PENDING"),
    # a flag beside the base state reads as 22.05 prints it (job_state_string(): flags first), so
    # a job still completing stays active: was "RUNNING"/"COMPLETED" (first entry) before
    (["RUNNING", "COMPLETING"], "COMPLETING"),
    (["COMPLETED", "COMPLETING"], "COMPLETING"),
    (["PENDING", "REQUEUED"], "REQUEUED"),
    (["RUNNING", "RESIZING"], "RESIZING"),
    ([], ""),
])
def test_squeue_state_as_list(state, want):
    text = json.dumps({"jobs": [{"job_id": 7, "job_state": state}]})
    assert parse_squeue_json(text)["7"].state == want


@pytest.mark.parametrize("text", [
    SQUEUE_RUNNING[:-40],                      # truncated
    "",
    "not json",
    '{"jobs": 5}',
    '{"jobs": {"a": 1}}',
    '{"jobs": ["x"]}',
    '{"jobs": [{"name": "no id"}]}',
    '{"jobs": [{"job_id": 1, "node_count": "many"}]}',
    '{"jobs": [{"job_id": 1, "tres_per_node": 5}]}',
    '{"meta": {}}',
    "[1, 2]",
])
def test_squeue_malformed_raises_slurm_error(text):
    with pytest.raises(SlurmError):
        parse_squeue_json(text)


@pytest.mark.parametrize("parse, text", [(parse_squeue_json, SQUEUE_DOWN),
                                         (parse_sinfo_json, SINFO_DOWN)])
def test_controller_down_output_is_unavailable_not_empty(parse, text):
    """22.05 exits 0 with errors and an empty list when slurmctld does not answer."""
    with pytest.raises(SlurmUnavailable, match="Unspecified error"):
        parse(text)


@pytest.mark.parametrize("errors", [
    [{"error": "Unable to contact slurm controller (connect failure)"}],
    ["Socket timed out on send/recv operation"],
])
def test_unreachable_message_in_errors_is_unavailable(errors):
    with pytest.raises(SlurmUnavailable):
        parse_squeue_json(json.dumps({"errors": errors, "jobs": []}))


def test_errors_beside_data_are_an_error_not_unavailable():
    text = json.dumps({"errors": [{"error": "Unspecified error", "errno": -1}],
                       "jobs": [{"job_id": 1}]})
    with pytest.raises(SlurmError) as ei:
        parse_squeue_json(text)
    assert not isinstance(ei.value, SlurmUnavailable)


# --------------------------------------------------------------------------------------------
# The resize script
# --------------------------------------------------------------------------------------------


def test_parse_resize_script_as_22_05_writes_it():
    # What `scontrol update JobId=$SLURM_JOB_ID NumNodes=1` wrote after 3 -> 1 (notes §3).
    text = """#!/bin/sh
export SLURM_NODELIST="n1"
export SLURM_JOB_NODELIST="n1"
export SLURM_NNODES=1
export SLURM_JOB_NUM_NODES=1
export SLURM_JOB_CPUS_PER_NODE="1"
unset SLURM_NPROCS
unset SLURM_NTASKS
unset SLURM_TASKS_PER_NODE
echo ignored
"""
    setv, unset = parse_resize_script(text)
    assert setv == {"SLURM_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1",
                    "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_CPUS_PER_NODE": "1"}
    assert unset == ["SLURM_NPROCS", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"]
    assert parse_resize_script("") == ({}, [])


# --------------------------------------------------------------------------------------------
# Recorded outputs of real 22.05.8, 24.11.5 and 26.05.5 controllers (tests/data/slurm/record.py)
# --------------------------------------------------------------------------------------------

DATA = Path(__file__).parent / "data" / "slurm"
VERSIONS = {"22.05": ("22.05.8", 38), "24.11": ("24.11.5", 42), "26.05": ("26.05.5", 45)}

# The same scenario on every version (record.py), in the "busy" moment: scenario name ->
# (state, reason, nodes, node_count, gpus_per_node, restarts, batch_host). User root, partition gpu.
BUSY_JOBS = {
    "running": ("RUNNING", "None", "n[1-2]", 2, 2, 0, "n1"),
    "resized": ("RUNNING", "None", "n1", 1, 1, 0, "n1"),          # sbatch -N2, then NumNodes=1
    "requeued": ("PENDING", "BeginTime", "", 1, 1, 1, ""),         # scontrol requeue
    "held": ("PENDING", "JobHeldUser", "", 1, 0, 0, ""),
    "pending": ("PENDING", "Resources", "", 2, 4, 0, ""),
    "completed": ("COMPLETED", "None", "n1", 1, 0, 0, "n1"),
    "failed": ("FAILED", "NonZeroExitCode", "n1", 1, 0, 0, "n1"),
    "cancelled": ("CANCELLED", "JobHeldUser", "", 1, 0, 0, ""),
}
FINISHED = {"completed", "failed", "cancelled"}
# sinfo at each moment: node -> (gpus, gpus_allocated, state); partitions ("gpu",) everywhere.
NODES = {
    "idle": {"n1": (4, 0, "idle"), "n2": (4, 0, "idle")},
    "busy": {"n1": (4, 3, "mixed"), "n2": (4, 2, "mixed")},
    "drain": {"n1": (4, 3, "mixed"), "n2": (4, 2, "mixed+drain")},
}


def _recorded(version: str, name: str) -> str:
    return (DATA / version / name).read_text()


def _job_ids(version: str) -> dict[str, str]:
    return {j: k for k, j in json.loads(_recorded(version, "jobs.json")).items()}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["squeue.busy.json", "squeue-t-all.busy.json", "sinfo.idle.json",
                                  "sinfo-N.drain.json"])
def test_recorded_doc_version(version, name):
    assert doc_version(json.loads(_recorded(version, name))) == VERSIONS[version]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["squeue.busy.json", "squeue-t-all.busy.json"])
def test_recorded_squeue(version, name):
    ids = _job_ids(version)
    jobs = parse_squeue_json(_recorded(version, name))
    got = {ids[j.job_id]: (j.state, j.state_reason, j.nodes, j.node_count, j.gpus_per_node, j.restarts,
                           j.batch_host) for j in jobs.values()}
    # 22.05 lists finished jobs without -t all; 23.02+ only with it (docs/slurm-versions.md)
    want = {k: v for k, v in BUSY_JOBS.items() if version == "22.05" or "t-all" in name or k not in FINISHED}
    assert got == want
    assert {(j.user, j.partition, j.cpus_per_task) for j in jobs.values()} == {("root", "gpu", 1)}
    assert jobs[json.loads(_recorded(version, "jobs.json"))["running"]].priority > 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["squeue.busy.json", "squeue-t-all.busy.json", "squeue.idle.json",
                                  "squeue-t-all.drain.json"])
def test_fields_dropped_while_decoding_change_no_job(version, name):
    """parse_squeue_json drops each job's unread fields as it decodes (parse._slim_job); the
    jobs are those of the whole document, field for field, on every recorded version."""
    text = _recorded(version, name)
    whole = {str(j["job_id"]): parse._job_from_json(j) for j in json.loads(text)["jobs"]}
    assert parse_squeue_json(text) == whole


def test_a_job_keeps_only_the_fields_read_and_other_objects_keep_all():
    doc = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [],
           "jobs": [{"job_id": 7, "job_state": "RUNNING", "nodes": "n1", "gres_detail": ["gpu:2(IDX:0-1)"],
                     "job_resources": {"allocated_nodes": [{"nodename": "n1", "cpus": 2}]},
                     "command": "/x/" * 1000, "submit_time": {"set": True, "number": 5}}]}
    out = json.loads(json.dumps(doc), object_pairs_hook=parse._slim_job)
    assert out["meta"] == doc["meta"]
    assert out["jobs"] == [{"job_id": 7, "job_state": "RUNNING", "nodes": "n1",
                            "gres_detail": ["gpu:2(IDX:0-1)"], "submit_time": {"set": True, "number": 5}}]
    assert set(out["jobs"][0]) <= parse.JOB_FIELDS


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_squeue_planned_nodes(version):
    """23.02+'s JSON says where backfill plans pending jobs ("" here: none planned); 22.05's
    has no such field (None: the CLI backend asks ``squeue -o %Y``)."""
    jobs = parse_squeue_json(_recorded(version, "squeue.busy.json"))
    assert {j.scheduled_nodes for j in jobs.values()} == ({None} if version == "22.05" else {""})


def test_planned_nodes_from_squeue_format():
    # the form 22.05.8 prints: a hostlist for a planned job, "(null)" for one without a plan
    assert parse_scheduled_nodes("662|n[1-4]\n663|(null)\n\n12_3|n2\n14+0|n1\n") == {
        "662": "n[1-4]", "12_3": "n2", "14+0": "n1"}
    assert parse_scheduled_nodes("") == {}
    for bad in ("662 n[1-4]", "squeue: error: Invalid user|x"):
        with pytest.raises(SlurmError, match="unexpected line"):
            parse_scheduled_nodes(bad)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("moment", NODES)
@pytest.mark.parametrize("form", ["sinfo", "sinfo-N"])
def test_recorded_sinfo(version, moment, form):
    nodes = parse_sinfo_json(_recorded(version, f"{form}.{moment}.json"))
    assert {n.name: (n.gpus, n.gpus_allocated, n.state) for n in nodes} == NODES[moment]
    assert {n.partitions for n in nodes} == {("gpu",)}
    assert len(nodes) == 2


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_recorded_sinfo_groups_like_nodes(version):
    """Idle, 23.02+ sinfo --json gives one group for n[1-2]; the parser splits it."""
    doc = json.loads(_recorded(version, "sinfo.idle.json"))
    assert [e["nodes"]["nodes"] for e in doc["sinfo"]] == [["n1", "n2"]]


@pytest.mark.parametrize("value, want", [
    (3, 3), (None, 0), ({"set": True, "infinite": False, "number": 2}, 2),
    ({"set": False, "infinite": False, "number": 0}, 0), ({"set": True, "infinite": True, "number": 0}, 0),
])
def test_numbers_of_every_version(value, want):
    text = json.dumps({"jobs": [{"job_id": 7, "node_count": value, "priority": value}]})
    job = parse_squeue_json(text)["7"]
    assert (job.node_count, job.priority) == (want, want)


@pytest.mark.parametrize("entry", [{"node": {"state": ["IDLE"]}}, {"nodes": {"nodes": "n1"}}, {"nodes": [1]}])
def test_sinfo_group_without_node_names_raises(entry):
    doc = {"meta": {"plugin": {"data_parser": "data_parser/v0.0.42"}}, "errors": [], "sinfo": [entry]}
    with pytest.raises(SlurmError, match="nodes.nodes"):
        parse_sinfo_json(json.dumps(doc))


@pytest.mark.parametrize("state, tres, detail, want", [
    # a pending job asked 3, the daemon set 1 as Slurm started it: it holds 3
    ("RUNNING", "gres:gpu:1", ["gpu:3(IDX:0-2)"], 3),
    ("RUNNING", "gres/gpu:2", ["gpu:2(IDX:0-1)", "gpu:2(IDX:2-3)"], 2),
    ("RUNNING", "gres:gpu:2", [], 2),                 # no detail: the request
    ("RUNNING", "gres:gpu:2", [None, 7], 2),          # nothing readable: the request
    ("PENDING", "gres:gpu:1", ["gpu:3(IDX:0-2)"], 1),  # pending: what it asks
])
def test_a_running_jobs_gpus_per_node_are_what_it_holds(state, tres, detail, want):
    doc = {"jobs": [{"job_id": 5, "job_state": state, "name": "x", "user_name": "u",
                     "partition": "gpu", "nodes": "n1", "node_count": 1, "tres_per_node": tres,
                     "gres_detail": detail, "restart_cnt": 0, "batch_host": "n1", "priority": 1}]}
    assert parse_squeue_json(json.dumps(doc))["5"].gpus_per_node == want
