"""The default checkpoint interval (issue 33): Young/Daly's ``sqrt(2 x cost x MTBF)`` of the
measured checkpoint time and the job's MTBF (its nodes' over their count), unless the user
gives an interval; hpcsub writes the job's MTBF into its spec."""

from __future__ import annotations

import math
import time

import pytest

from hpcsched.job.checkpoint import (
    ASSUMED_COST_S,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    Checkpointer,
    young_daly_interval,
)
from hpcsched.job.sbatch_args import UsageError
from hpcsched.job.submit import NODE_MTBF_S, build_spec


@pytest.mark.parametrize("cost,mtbf,want", [
    (2.0, 86400.0, math.sqrt(2 * 2 * 86400)),      # 588 s
    (10.0, 604800.0, math.sqrt(2 * 10 * 604800)),  # 3478 s
    (0.01, 3600.0, MIN_INTERVAL_S),                 # never more often than a minute
    (600.0, 1e9, MAX_INTERVAL_S),                   # at least every 6 hours
])
def test_young_daly(cost, mtbf, want):
    assert young_daly_interval(cost, mtbf) == pytest.approx(want)


def test_the_interval_follows_the_measured_cost(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    ck = Checkpointer(tmp_path, interval=0.0, mtbf=86400.0)
    assert ck.period == pytest.approx(young_daly_interval(ASSUMED_COST_S, 86400.0))
    ck.written(2.0)
    assert ck.period == pytest.approx(math.sqrt(2 * 2.0 * 86400))   # 588 s
    clock[0] += 500
    assert not ck.due
    clock[0] += 100
    assert ck.due
    ck.written(4.0)                       # exponential average: (2 + 4) / 2
    assert ck.cost == pytest.approx(3.0) and not ck.due


def test_a_given_interval_or_none_at_all(tmp_path):
    assert Checkpointer(tmp_path, interval=30.0, mtbf=86400.0).period == 30.0
    assert Checkpointer(tmp_path, interval=0.0, mtbf=0.0).period == 0.0
    assert Checkpointer(None, interval=0.0, mtbf=86400.0).period == 0.0   # nowhere to write


def _spec(tmp_path, monkeypatch, *args):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    spec, _, _ = build_spec([*args, str(script)], "uid", tmp_path / "job")
    return spec


def test_hpcsub_gives_the_job_its_mtbf(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCSCHED_NODE_MTBF", raising=False)
    spec = _spec(tmp_path, monkeypatch, "-N", "2", "--gres=gpu:4")
    assert (spec.checkpoint_interval, spec.mtbf) == (0.0, NODE_MTBF_S / 2)
    spec = _spec(tmp_path, monkeypatch, "-N", "2", "--gres=gpu:4", "--hpcsched-node-mtbf", "3600")
    assert spec.mtbf == 1800.0
    monkeypatch.setenv("HPCSCHED_NODE_MTBF", "7200")
    assert _spec(tmp_path, monkeypatch, "--gres=gpu:4").mtbf == 7200.0
    for given in ("30", "0"):      # the user's interval, or none: no MTBF rule
        spec = _spec(tmp_path, monkeypatch, "--gres=gpu:4", "--hpcsched-checkpoint-interval", given)
        assert (spec.checkpoint_interval, spec.mtbf) == (float(given), 0.0)


def test_a_bad_mtbf_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="--hpcsched-node-mtbf: expected a number > 0"):
        _spec(tmp_path, monkeypatch, "--gres=gpu:4", "--hpcsched-node-mtbf", "0")
    monkeypatch.setenv("HPCSCHED_NODE_MTBF", "soon")
    with pytest.raises(UsageError, match="HPCSCHED_NODE_MTBF: expected a number"):
        _spec(tmp_path, monkeypatch, "--gres=gpu:4")
