"""A policy per partition (issue 34, "site controls"): ``[policy.partitions.NAME]`` in the
configuration, each group of partitions planned on its own part of the cluster
(``decide_by_partition``), partitions that share nodes refused by the round and by ``hpcsched
check``."""

from __future__ import annotations

import pytest

from hpcsched.daemon import config as cfg
from hpcsched.daemon import preflight as pf
from hpcsched.model.snapshot import ClusterSnapshot, ForeignJob, JobView, NodeView, ProfilePoint
from hpcsched.policies import make_policy
from hpcsched.policies.reconcile import Costs
from hpcsched.policies.round import PartitionOverlap, decide_by_partition, partition_view
from hpcsched.protocol.limits import JobLimits

LINEAR = tuple(ProfilePoint(g, 1, 64, 1, 0.1, 640.0 * g, 20) for g in (1, 2, 4))


def _job(job_id: str, partition: str, node: str) -> JobView:
    return JobView(job_id=job_id, state="RUNNING", nodes=1, node_names=(node,),
                   limits=JobLimits(4, 1, 4, 64, 256, None, 64), batch_size=64, submit_time=0.0,
                   profile=LINEAR, partition=partition, remaining_samples=1e6, layout=(1,),
                   primary=(1,))


def _snap(nodes, jobs, foreign=()) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, tuple(nodes), tuple(jobs), partitions=("a100", "v100"),
                           foreign_pending=tuple(foreign), granularity="gpu")


NODES = (NodeView("a1", 4, 1, "mixed", ("a100",)), NodeView("a2", 4, 0, "idle", ("a100",)),
         NodeView("v1", 4, 1, "mixed", ("v100",)), NodeView("v2", 4, 0, "idle", ("v100",)))


def test_a_partitions_view_has_its_nodes_jobs_and_pending_jobs_only():
    snap = _snap(NODES, [_job("1", "a100", "a1"), _job("2", "v100", "v1")],
                 [ForeignJob("9", "bob", 1, 4, 10, partition="v100")])
    a = partition_view(snap, frozenset({"a100"}))
    assert [n.name for n in a.nodes] == ["a1", "a2"] and [j.job_id for j in a.jobs] == ["1"]
    assert a.foreign_pending == () and a.partitions == ("a100",)
    v = partition_view(snap, frozenset({"v100"}))
    assert [f.job_id for f in v.foreign_pending] == ["9"]


def test_each_partition_is_planned_by_its_own_policy_on_its_own_nodes():
    snap = _snap(NODES, [_job("1", "a100", "a1"), _job("2", "v100", "v1")])
    d = decide_by_partition(snap, make_policy("jct"), {"a100": make_policy("dp")}, Costs(), 0)
    assert d.plan.policy == "dp+jct"
    # each job grows within its partition's 8 GPUs (2 nodes), nowhere else
    assert sorted((c.job_id, c.kind, c.to_gpus) for c in d.changes) == [
        ("1", "grow", 8), ("2", "grow", 8)]
    for c in d.changes:
        assert {n for n, _ in c.layout} <= {"1": {"a1", "a2"}, "2": {"v1", "v2"}}[c.job_id], c
    assert any(n.startswith("[a100] ") for n in d.notes)
    assert any(n.startswith("[v100] ") for n in d.notes)
    alone = decide_by_partition(snap, make_policy("jct"), {}, Costs(), 0)   # one cluster
    assert alone.plan.policy == "jct"
    assert max(c.to_gpus for c in alone.changes) > 8, alone.changes


def test_partitions_sharing_nodes_cannot_have_different_policies():
    shared = NODES + (NodeView("x1", 4, 0, "idle", ("a100", "v100")),)
    with pytest.raises(PartitionOverlap, match="node x1"):
        decide_by_partition(_snap(shared, [_job("1", "a100", "a1")]), make_policy("jct"),
                            {"a100": make_policy("dp")}, Costs(), 0)


def _write(tmp_path, text):
    p = tmp_path / "hpcsched.toml"
    p.write_text(text)
    return p


def test_the_configuration_names_a_policy_per_partition(tmp_path):
    head = '[daemon]\npartitions = ["a100", "v100"]\n'
    s = cfg.load(_write(tmp_path, head + '[policy.partitions.a100]\nname = "pollux"\n'),
                 env={}, policy_names=["jct", "pollux"])
    assert s.policy.for_partitions() == {"a100": ("pollux", {})}
    for body, message in (
            ('[policy.partitions.h100]\nname = "pollux"\n', "'h100' is not one of [daemon] partitions"),
            ('[policy.partitions.a100]\nname = "nosuch"\n', "unknown policy 'nosuch'"),
            ('[policy.partitions.a100]\nname = "jct"\nfoo = 1\n', "unknown key 'foo'"),
            ('[policy.partitions.a100]\nname = "jct"\n[policy.partitions.a100.params]\nnosuch = 1\n',
             "[policy.partitions.a100] params")):
        with pytest.raises(cfg.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            cfg.load(_write(tmp_path, head + body), env={}, policy_names=["jct", "pollux"])


def test_check_fails_on_partitions_with_different_policies_sharing_nodes(tmp_path):
    s = cfg.load(_write(tmp_path, '[daemon]\npartitions = ["a100", "v100"]\n'
                                  '[policy.partitions.a100]\nname = "pollux"\n'), env={})
    disjoint = {"a100": {"Nodes": "a[1-2]"}, "v100": {"Nodes": "v[1-2]"}}
    ok = pf.check_partition_policies(s, disjoint)
    assert ok.status == "ok" and "a100: pollux, v100: jct" in ok.text
    bad = pf.check_partition_policies(s, {**disjoint, "v100": {"Nodes": "a2,v[1-2]"}})
    assert bad.status == "FAIL" and "node a2" in bad.text
    plain = cfg.load(_write(tmp_path, "[daemon]\n"), env={})
    assert pf.check_partition_policies(plain, disjoint) is None
