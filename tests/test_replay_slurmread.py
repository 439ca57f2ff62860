"""What hpcsched replay reads from Slurm: fixtures captured on the dev cluster (Slurm 22.05.8,
2026-11-24): ``sbatch -J fx-replay -N1 --gres=gpu:1 --wrap 'sleep 6'`` (job 1417), requeued
(``scontrol requeue`` + ``StartTime=now``) 3 s after it was submitted, ``squeue --json
--states=all`` while running, after the requeue and once completed (trimmed to the fields
read), and ``sacct -X -P -n --duplicates -o JobID,State,Submit,Start,End`` for it and two jobs of
the test suite (1389 resized, 1412 requeued)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from hpcsched.model.snapshot import NodeView
from hpcsched.replay import ReplayError
from hpcsched.replay.plan import ClusterShape
from hpcsched.replay.slurmread import (
    JobRecord,
    cluster_shape,
    parse_job_times,
    parse_sacct,
)
from hpcsched.slurm.errors import SlurmUnavailable
from hpcsched.slurm.parse import parse_sinfo_json
from tests.slurm_outputs import SINFO_IDLE, SQUEUE_DOWN

_META = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
         "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}}
_JOB = {"job_id": 1417, "state_reason": "None", "name": "fx-replay", "user_name": "root",
        "partition": "gpu", "nodes": "n1", "node_count": 1, "tres_per_node": "gres:gpu:1",
        "gres_detail": ["gpu:1(IDX:0)"], "batch_host": "n1", "priority": 4294901035,
        "comment": ""}


def _squeue(**fields) -> str:
    return json.dumps({"meta": _META, "errors": [], "jobs": [dict(_JOB, **fields)]})


RUNNING = _squeue(job_state="RUNNING", restart_cnt=0, submit_time=1795509783,
                  start_time=1795509784, end_time=1827045784, eligible_time=1795509783)
REQUEUED = _squeue(job_state="RUNNING", restart_cnt=1, submit_time=1795509786,
                   start_time=1795509787, end_time=1827045787, eligible_time=1795509787)
COMPLETED = _squeue(job_state="COMPLETED", restart_cnt=1, submit_time=1795509786,
                    start_time=1795509787, end_time=1795509793, eligible_time=1795509787,
                    gres_detail=[])
PENDING = _squeue(job_state="PENDING", restart_cnt=0, submit_time=1795509783, start_time=0,
                  end_time=0, nodes="")

SACCT = """\
1389|RESIZING|2026-11-24T08:18:14|2026-11-24T08:18:17|2026-11-24T08:18:22
1389|COMPLETED|2026-11-24T08:18:22|2026-11-24T08:18:25|2026-11-24T08:18:54
1412|REQUEUED|2026-11-24T08:28:13|2026-11-24T08:28:16|2026-11-24T08:28:28
1412|COMPLETED|2026-11-24T08:28:28|2026-11-24T08:28:43|2026-11-24T08:29:43
1417|REQUEUED|2026-11-24T08:43:03|2026-11-24T08:43:04|2026-11-24T08:43:06
1417|CANCELLED by 0|2026-11-24T08:43:06|2026-11-24T08:43:07|2026-11-24T08:43:13
1420|PENDING|2026-11-24T08:50:00|Unknown|Unknown
"""


def _t(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_requeued_jobs_times_merge_to_its_original_submission():
    rec = JobRecord("1417")
    for text in (RUNNING, REQUEUED, COMPLETED):
        rec = rec.seen(parse_job_times(text)["1417"])
    assert rec == JobRecord("1417", "COMPLETED", submit=1795509783.0, start=1795509787.0,
                            end=1795509793.0, requeues=1)
    assert rec.ended


@pytest.mark.parametrize("text, state, submit, start, end, restarts", [
    (RUNNING, "RUNNING", 1795509783.0, 1795509784.0, None, 0),   # end_time: the time limit
    (REQUEUED, "RUNNING", 1795509786.0, 1795509787.0, None, 1),  # submit_time rewritten
    (COMPLETED, "COMPLETED", 1795509786.0, 1795509787.0, 1795509793.0, 1),
    (PENDING, "PENDING", 1795509783.0, None, None, 0),
    # 24.11+ (data parser v0.0.40+): times as {"set", "infinite", "number"}, state as a list
    (_squeue(job_state=["COMPLETED"], restart_cnt=0,
             submit_time={"set": True, "infinite": False, "number": 100},
             start_time={"set": True, "infinite": False, "number": 110},
             end_time={"set": True, "infinite": False, "number": 170}),
     "COMPLETED", 100.0, 110.0, 170.0, 0),
    (_squeue(job_state=["PENDING"], restart_cnt=0,
             submit_time={"set": True, "infinite": False, "number": 100},
             start_time={"set": False, "infinite": False, "number": 0},
             end_time={"set": True, "infinite": True, "number": 0}),
     "PENDING", 100.0, None, None, 0),
])
def test_job_times(text, state, submit, start, end, restarts):
    t = parse_job_times(text)["1417"]
    assert (t.state, t.submit, t.start, t.end, t.restarts) == (state, submit, start, end, restarts)


def test_a_controller_that_does_not_answer():
    with pytest.raises(SlurmUnavailable):
        parse_job_times(SQUEUE_DOWN)


def test_sacct_records():
    recs = parse_sacct(SACCT)
    assert recs["1412"] == JobRecord("1412", "COMPLETED", _t("2026-11-24T08:28:13"),
                                     _t("2026-11-24T08:28:43"), _t("2026-11-24T08:29:43"), 1)
    assert recs["1389"].requeues == 0 and recs["1389"].submit == _t("2026-11-24T08:18:14")
    assert recs["1417"].state == "CANCELLED" and recs["1417"].requeues == 1
    assert recs["1420"] == JobRecord("1420", "PENDING", _t("2026-11-24T08:50:00"), None, None, 0)
    assert parse_sacct("") == {} and parse_sacct("garbage line\n") == {}


def test_cluster_shape_of_the_dev_cluster():
    nodes = parse_sinfo_json(SINFO_IDLE)
    assert cluster_shape(nodes, "gpu") == ClusterShape(4, 4, "gpu")
    assert cluster_shape(nodes, None).gpus == 16


@pytest.mark.parametrize("nodes, partition, expect", [
    ([NodeView("a", 8, 0, "idle", ("p",)), NodeView("b", 4, 0, "idle", ("p",)),
      NodeView("c", 2, 0, "idle", ("q",))], "p", (2, 4)),
    ([NodeView("a", 8, 0, "idle", ("p",)), NodeView("c", 2, 0, "idle", ("q",))], None, (2, 2)),
])
def test_cluster_shape_takes_the_fewest_gpus_of_the_partition(nodes, partition, expect):
    s = cluster_shape(nodes, partition)
    assert (s.nodes, s.gpus_per_node, s.partition) == (*expect, partition)


@pytest.mark.parametrize("nodes, partition, message", [
    ([NodeView("a", 4, 0, "idle", ("gpu",))], "debug", "partition 'debug' has no nodes"),
    ([], None, "Slurm lists no nodes"),
    ([NodeView("a", 0, 0, "idle", ("cpu",))], "cpu", "without GPUs"),
])
def test_cluster_shape_errors(nodes, partition, message):
    with pytest.raises(ReplayError, match=message):
        cluster_shape(nodes, partition)
