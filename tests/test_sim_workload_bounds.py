"""Hostile workload values: each is refused with a WorkloadError, one line naming file and line,
and ``hpcsched simulate`` exits 2 with that line and no traceback (values that used to crash
``dp`` and ``ones`` or never finish: issue 9, item 5). No Slurm."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hpcsched.cli import main
from hpcsched.sim import workload as wl
from hpcsched.sim.workload import load_workload
from tests.test_sim_workload import assert_refused

POLLUX = "name,time,application,num_replicas,batch_size\n"
PAL = "job_id,num_gpus,submit_time,duration,model,batch_size\n"

BAD = [
    # batch sizes past 16 x the largest validated one (ncf: 32,768) or 2**24 and 2**63
    (POLLUX + "a,0,ncf,1,9223372036854775808\n", "batch_size must be at most 524288"),
    (POLLUX + "a,0,ncf,1,9223372036854775807\n", "batch_size must be at most 524288"),
    (POLLUX + "a,0,ncf,1,18446744073709551616\n", "batch_size must be at most 524288"),
    (POLLUX + "a,0,ncf,1,524289\n", "16 x ncf's largest validated batch size 32768"),
    (POLLUX + "a,0,bert,1,6145\n", "batch_size must be at most 6144"),
    (POLLUX + "a,0,ncf,1,1e400\n", "batch_size must be finite"),
    (POLLUX + "a,0,ncf,1,inf\n", "batch_size must be finite"),
    (POLLUX + "a,0,ncf,1,nan\n", "batch_size must be finite"),
    # submit times past 10 years, or not finite
    (POLLUX + "a,1e300,ncf,1,256\n", "time (s) must be at most 315360000 (10 years)"),
    (POLLUX + "a,315360001,ncf,1,256\n", "must be at most 315360000"),
    (POLLUX + "a,inf,ncf,1,256\n", "time must be finite"),
    (POLLUX + "a,-inf,ncf,1,256\n", "time must be finite"),
    # GPU counts
    (POLLUX + "a,0,ncf,16777217,256\n", "num_replicas must be at most 16777216"),
    (POLLUX + "a,0,ncf,nan,256\n", "num_replicas must be finite"),
    # PAL/Blox rows: the same bounds, and at most 10 years of work
    (PAL + "0,1,1e300,10,vgg19,\n", "submit_time (s) must be at most 315360000"),
    (PAL + "0,1,0,10,vgg19,9223372036854775808\n", "batch_size must be at most 204800"),
    (PAL + "0,1,0,1e300,GPT2,\n", "duration (iterations) must be at most 88301506 for GPT2"),
    (PAL + "0,1,0,nan,GPT2,\n", "duration must be finite"),
    (PAL + "0,16777217,0,10,vgg19,\n", "num_gpus must be at most 16777216"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_hostile_values_are_refused_naming_file_and_line(tmp_path, text, message):
    assert_refused(tmp_path, text, 2, message)


@pytest.mark.parametrize("text", [
    POLLUX + "a,315360000,ncf,1,524288\n",          # the bounds themselves
    POLLUX + "a,0,bert,1,6144\n",
    PAL + "0,1,0,88301506,GPT2,\n",
])
def test_values_at_the_bounds_are_accepted(tmp_path, text):
    f = tmp_path / "edge.csv"
    f.write_text(text)
    assert len(load_workload(str(f))[1]) == 1


def test_bounds_are_the_documented_ones():
    assert wl.MAX_SUBMIT_TIME == 10 * 365 * 86400
    assert wl.MAX_COUNT == 2**24
    assert wl._batch_limit("ncf")[0] == 16 * 32768
    for word in ("10 years", "2**24", "16 x"):
        assert word in wl.__doc__


@pytest.mark.parametrize("policy", ["dp", "ones"])
@pytest.mark.parametrize("text, message", [BAD[0], BAD[8], BAD[16]])
def test_simulate_exits_2_with_the_message_and_no_traceback(tmp_path, policy, text, message):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    res = CliRunner().invoke(main, ["simulate", "-w", str(f), "-p", policy, "-q"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert message in res.output and f"{f}:2: " in res.output
