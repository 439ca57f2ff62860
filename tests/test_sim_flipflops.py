"""Flip-flops (a resize undone within two rounds, issue 9 item 4) in hpcsched.sim.report: the
pure count on hand-made resize logs, the summary's figures, the table and ``simulate --json``.
No Slurm."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from hpcsched.sim import JobResult, SimResult, report
from hpcsched.sim.report import flip_flops


def log(*moves):
    """``(round, before, after)`` triples as a resize log (time = 60 s x round)."""
    return tuple((60.0 * r, r, before, after) for r, before, after in moves)


@pytest.mark.parametrize("moves, expected", [
    ((), 0),
    (((1, 4, 8),), 0),                                   # one grow, never undone
    (((1, 4, 8), (2, 8, 4)), 1),                         # grow, shrink next round
    (((1, 4, 8), (3, 8, 4)), 1),                         # ... two rounds later: still
    (((1, 4, 8), (4, 8, 4)), 0),                         # ... three rounds later: not
    (((5, 8, 4), (6, 4, 8)), 1),                         # shrink then grow
    (((1, 4, 0), (2, 0, 4)), 1),                         # preemption (a shrink), its release
    (((1, 0, 4), (2, 4, 0)), 1),                         # release (a grow), preempted again
    (((1, 4, 8), (2, 8, 16)), 0),                        # two grows: same direction
    (((1, 4, 8), (2, 8, 16), (3, 16, 4)), 1),            # only the second grow is undone
    (((1, 4, 8), (2, 8, 4), (3, 4, 8)), 2),              # grow, shrink, grow: each undone
    (((1, 4, 8), (2, 8, 4), (3, 4, 8), (4, 8, 4)), 3),
    (((1, 4, 8), (2, 8, 8), (3, 8, 4)), 1),              # an entry that changes nothing: skipped
    (((1, 4, 8), (1, 8, 4)), 1),                         # same round
    (((1, 4, 8), (10, 8, 4), (11, 4, 8)), 1),            # first pair too far apart
])
def test_flip_flops_by_hand(moves, expected):
    assert flip_flops(log(*moves)) == expected


@pytest.mark.parametrize("within, expected", [(0, 0), (1, 1), (2, 2), (5, 2)])
def test_flip_flop_window(within, expected):
    # grow in round 1, shrink in round 3 (2 later), grow in round 4 (1 later)
    assert flip_flops(log((1, 4, 8), (3, 8, 4), (4, 4, 8)), within) == expected


def job(name, resize_log=(), finish=100.0):
    return JobResult(name=name, application="cifar10", submit_time=0.0, start_time=0.0,
                     finish_time=finish, gpu_seconds=100.0, restarts=0,
                     resizes=len(resize_log), requested_gpus=4, max_gpus=16,
                     resize_log=resize_log)


def sim(*jobs):
    return SimResult(policy="dp", workload="w", jobs=tuple(jobs), utilization=(),
                     total_gpus=16, rounds=10, wall_seconds=0.1)


@pytest.mark.parametrize("jobs, resizes, flips, fraction", [
    ((job("a"), job("b")), 0, 0, None),
    ((job("a", log((1, 4, 8), (2, 8, 4))), job("b", log((1, 4, 8)))), 3, 1, 1 / 3),
    # flip-flops are per job: a's grow and b's shrink in the next round are no flip-flop
    ((job("a", log((1, 4, 8))), job("b", log((2, 8, 4)))), 2, 0, 0.0),
    ((job("a", log((1, 4, 0), (2, 0, 4), (3, 4, 4))),), 2, 1, 0.5),
])
def test_summary_counts_resizes_and_flip_flops(jobs, resizes, flips, fraction):
    s = report.summarize(sim(*jobs))
    assert (s["resizes"], s["flip_flops"]) == (resizes, flips)
    assert s["flip_flop_fraction"] == (None if fraction is None else pytest.approx(fraction))
    json.dumps(s)


def test_table_shows_flip_flops():
    from rich.console import Console

    summaries = [report.summarize(sim(job("a", log((1, 4, 8), (2, 8, 4))), job("b", log((1, 4, 8))))),
                 report.summarize(sim(job("a")))]
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(report.render_table(summaries))
    lines = console.export_text().splitlines()
    assert "FLIP-FLOPS" in lines[0]
    assert lines[1].split()[-2:] == ["1/3", "(33.3%)"]
    assert lines[2].split()[-1] == "0/0"


def test_simulate_json_has_flip_flops(tmp_path):
    from hpcsched.cli import main

    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,2,256\n"
                  "b,30,ncf,1,256\n")
    out = tmp_path / "s.json"
    res = CliRunner().invoke(main, ["simulate", "-w", str(wl), "-p", "dp", "-q", "--nodes", "1",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads(out.read_text())["runs"][0]
    assert {"resizes", "flip_flops", "flip_flop_fraction"} <= set(run)
    assert 0 <= run["flip_flops"] <= run["resizes"]
    if run["resizes"]:
        assert run["flip_flop_fraction"] == pytest.approx(run["flip_flops"] / run["resizes"])
    else:
        assert run["flip_flop_fraction"] is None
