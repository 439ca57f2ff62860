"""The daemon's snapshot of a job grown by extension jobs: which Slurm jobs are a managed job's
extensions (extension_jobs), its record widened to them when that is whole nodes
(with_extensions), and daemon_snapshot counting their GPUs as the job's, not other jobs'."""

from __future__ import annotations

import time
from pathlib import Path
from types import MappingProxyType

import pytest

from hpcsched import slurm
from hpcsched.daemon.views import daemon_snapshot, extension_jobs, with_extensions
from hpcsched.protocol.extensions import extension_comment
from hpcsched.protocol.jobdir import JobDir, current_user
from hpcsched.slurm.observe import Observation
from tests.conftest import running_job_dir

ME = current_user()


def job(job_id, nodes="n1", gpus=4, state="RUNNING", comment="", user=ME):
    return slurm.JobInfo(job_id=job_id, name="", user=user, state=state, state_reason="None",
                         partition="gpu", nodes=nodes, node_count=len(slurm.expand_hostlist(nodes)),
                         gpus_per_node=gpus, restarts=0, batch_host=nodes[:2], priority=1,
                         comment=comment)


def ext(job_id, nodes="n2", gpus=4, primary="10", uid="u-10", **kw):
    return job(job_id, nodes, gpus, comment=extension_comment(primary, uid, 1), **kw)


def obs(*infos):
    return Observation(time.time(), (), MappingProxyType({i.job_id: i for i in infos}), 2)


def managed(*infos):
    """Managed jobs: job ``N`` in directory ``u-N``."""
    return {i.job_id: (JobDir(Path("/nowhere") / f"u-{i.job_id}"), None, i) for i in infos}


P10 = job("10")

# (the primary's record, Slurm's jobs besides it, the extension ids that are the job's)
EXTENSION_JOBS = {
    "one extension": (P10, [ext("11")], ["11"]),
    "two, in job id order": (P10, [ext("100"), ext("99", nodes="n3")], ["99", "100"]),
    "an extension still pending is not holding GPUs": (P10, [ext("11", state="PENDING")], []),
    "a tag with another uid": (P10, [ext("11", uid="u-77")], []),
    "a tag of another user's job": (P10, [ext("11", user="mallory")], []),
    "a tag naming a job hpcsched does not manage": (P10, [ext("11", primary="20", uid="u-20")], []),
    "the primary is not running": (job("10", state="COMPLETING"), [ext("11")], []),
    "an untagged job": (P10, [job("11", "n2", comment="hpcsched-extension:10")], []),
}


@pytest.mark.parametrize("primary,others,expected", EXTENSION_JOBS.values(), ids=EXTENSION_JOBS.keys())
def test_extension_jobs(primary, others, expected):
    found = extension_jobs(obs(primary, *others), managed(primary))
    assert [e.job_id for e in found.get("10", ())] == expected
    assert set(found) <= {"10"}


# (primary nodes, its GPUs per node, extensions as (nodes, GPUs per node), workers per node,
#  the widened (nodes, node_count) or None)
WIDEN = {
    "a whole extra node": ("n1", 4, [("n2", 4)], 4, ("n1,n2", 2)),
    "two primaries' nodes, two extensions": ("n[1-2]", 4, [("n4", 4), ("n3", 4)], 4, ("n1,n2,n4,n3", 4)),
    "a multi-node extension": ("n1", 2, [("n[2-3]", 2)], 2, ("n1,n2,n3", 3)),
    "Slurm's GPUs per node unknown: the workers per node": ("n1", 0, [("n2", 2)], 2, ("n1,n2", 2)),
    "no extension": ("n1", 4, [], 4, ("n1", 1)),
    "part of a node: 4 + 2": ("n1", 4, [("n2", 2)], 4, None),
    "a node shared with the primary: 2 + 2 on n1": ("n1", 2, [("n1", 2)], 2, None),
    "the primary itself on part of its nodes": ("n1", 2, [("n2", 4)], 4, None),
}


@pytest.mark.parametrize("nodes,gpus,extensions,wpn,expected", WIDEN.values(), ids=WIDEN.keys())
def test_with_extensions(nodes, gpus, extensions, wpn, expected):
    primary = job("10", nodes, gpus)
    widened = with_extensions(primary, [job(str(11 + i), n, g) for i, (n, g) in enumerate(extensions)],
                              wpn)
    if expected is None:
        assert widened is None
    else:
        assert (widened.nodes, widened.node_count) == expected
        assert (widened.job_id, widened.state, widened.gpus_per_node) == ("10", "RUNNING", gpus)


@pytest.fixture
def primary_dir(control_dir):
    return running_job_dir(control_dir)


# (the extension's nodes and GPUs per node, the job's view (nodes, node names, GPUs), the
#  GPUs other jobs hold per node)
SNAPSHOTS = {
    "a whole node by extension: the job's": (
        ("n2", 4), (2, ("n1", "n2"), 8), (("n3", 1),)),
    "part of a node: other jobs' GPUs, as before extensions": (
        ("n2", 2), (1, ("n1",), 4), (("n2", 2), ("n3", 1))),
}


@pytest.mark.parametrize("extension,view,other", SNAPSHOTS.values(), ids=SNAPSHOTS.keys())
def test_daemon_snapshot_counts_extensions_for_their_job(primary_dir, store, extension, view, other):
    seen = obs(P10, ext("11", *extension, uid=primary_dir.uid), job("12", "n3", 1))
    spec = primary_dir.read_spec()
    snap = daemon_snapshot(seen, {"10": (primary_dir, spec, P10)}, store, set(), ())
    (j,) = snap.jobs
    assert (j.nodes, j.node_names, j.gpus) == view
    assert snap.other_gpus_allocated == other
