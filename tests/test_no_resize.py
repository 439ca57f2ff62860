"""``hpcsub --hpcsched-no-resize`` (issue 34): the job is managed (metrics, status, pre-timeout
checkpoints) but its limits are its submitted size and batch size, so no policy resizes it."""

from __future__ import annotations

import pytest

from hpcsched.job.sbatch_args import UsageError
from hpcsched.job.submit import build_spec
from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.policies import make_policy
from hpcsched.policies.reconcile import Costs
from hpcsched.policies.round import decide_round


def _spec(tmp_path, monkeypatch, *args):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return build_spec([*args, str(script)], "uid", tmp_path / "job")[0]


def test_the_limits_are_the_submitted_size(tmp_path, monkeypatch):
    s = _spec(tmp_path, monkeypatch, "-N", "2", "--gres=gpu:4", "--hpcsched-no-resize",
              "--hpcsched-batch-size", "256")
    lim = s.limits
    assert (lim.min_nodes, lim.max_nodes, lim.min_gpus, lim.max_gpus) == (2, 2, 8, 8)
    assert (lim.min_batch_size, lim.base_batch_size, lim.max_batch_size) == (256, 256, 256)


@pytest.mark.parametrize("extra", [("--hpcsched-max-nodes", "4"), ("--hpcsched-min-gpus", "2"),
                                   ("--hpcsched-max-batch-size", "512")])
def test_a_range_beside_it_is_one_line(tmp_path, monkeypatch, extra):
    with pytest.raises(UsageError, match=f"--hpcsched-no-resize pins the job's size: drop {extra[0]}"):
        _spec(tmp_path, monkeypatch, "--gres=gpu:4", "--hpcsched-no-resize", *extra)


def _changes(limits):
    """jct's changes for a job that would gain from every GPU, on n1 with 12 more GPUs free."""
    prof = tuple(ProfilePoint(w, 1, 32, 1, 0.1, w * 320.0, 50) for w in (1, 2, 4))
    job = JobView(job_id="J", state="RUNNING", nodes=1, node_names=("n1",), limits=limits,
                  batch_size=limits.base_batch_size, submit_time=0.0, profile=prof,
                  remaining_samples=1e7)
    snap = ClusterSnapshot(0.0, tuple(NodeView(f"n{k}", 4, 4 if k == 1 else 0, "mixed")
                                      for k in range(1, 5)), (job,), granularity="gpu")
    return decide_round(snap, make_policy("jct"), Costs(grow="extension", by_mechanism=True,
                                                        hold=0, min_gain=0.0), 0).changes


def test_jct_leaves_it_as_it_is(tmp_path, monkeypatch):
    may_grow = _spec(tmp_path, monkeypatch, "--gres=gpu:4", "--hpcsched-max-gpus", "16",
                     "--hpcsched-max-batch-size", "2048").limits
    assert _changes(may_grow), "the same job with a range is grown"
    pinned = _spec(tmp_path, monkeypatch, "--gres=gpu:4", "--hpcsched-no-resize").limits
    assert not _changes(pinned)
