"""The elastic API with real torch.distributed (gloo on CPU) processes, no Slurm.

Two workers train the digits example; mid-run hpcsched's control file changes the batch size
(in place, no restart), then asks for checkpoint-and-shrink; the job is relaunched with one
worker from that checkpoint and finishes. Checked from the job's own records.
"""

import time
from pathlib import Path

import pytest

from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.gloo_workers import join as _join
from tests.gloo_workers import launch as _launch
from tests.gloo_workers import wait_ack as _wait_ack
from tests.gloo_workers import write_control as _control
from tests.jobrecords import check_exactly_once, generations, load_records, mean_loss_by_step

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"
DIGITS = 1797


@pytest.mark.slow
def test_batch_change_in_place_then_shrink_from_checkpoint(tmp_path):
    jd = JobDir.create(tmp_path)
    epochs = 4
    procs = _launch(jd, world=2, generation=0, local=16, accum=1, launch=1, epochs=epochs)
    _wait_ack(jd, 0, "applied", procs)
    _control(jd, 1, "continue", world=2, local=8, accum=2)          # same global batch, new split
    a1 = _wait_ack(jd, 1, "applied", procs)
    assert (a1.local_batch_size, a1.accumulation_steps, a1.global_batch_size) == (8, 2, 32)
    _control(jd, 2, "continue", world=2, local=24, accum=1)         # batch size 32 -> 48
    _wait_ack(jd, 2, "applied", procs)
    time.sleep(1.0)
    _control(jd, 3, "checkpoint-and-shrink", world=1, local=48, accum=1)
    a3 = _wait_ack(jd, 3, "checkpointed", procs)
    assert Path(a3.checkpoint).is_file()
    _join(procs)
    assert all(p.returncode == 0 for p in procs)

    procs = _launch(jd, world=1, generation=3, local=48, accum=1, launch=2, epochs=epochs)
    _wait_ack(jd, 3, "applied", procs)
    out = _join(procs)[0]
    assert '"final_loss"' in out

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs)
    gens = generations(recs)
    assert gens[0] == dict(world_size=2, global_batch_size=32, local_batch_size=16, accumulation_steps=1)
    assert gens[1] == dict(world_size=2, global_batch_size=32, local_batch_size=8, accumulation_steps=2)
    assert gens[2] == dict(world_size=2, global_batch_size=48, local_batch_size=24, accumulation_steps=1)
    assert gens[3] == dict(world_size=1, global_batch_size=48, local_batch_size=48, accumulation_steps=1)
    # the batch changes happened without a restart: generations 0-2 all ran in launch 1
    assert {r["launch"] for r in recs if r["generation"] in (0, 1, 2)} == {1}
    assert {r["launch"] for r in recs if r["generation"] == 3} == {2}
    losses = mean_loss_by_step(recs)
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 * 0.5


def test_malformed_control_file_is_ignored_by_a_running_job(tmp_path):
    """A garbage control.json mid-run: the job logs it, keeps training, acts on nothing."""
    jd = JobDir.create(tmp_path)
    procs = _launch(jd, world=1, generation=0, local=64, accum=1, launch=1, epochs=2)
    _wait_ack(jd, 0, "applied", procs)
    jd.control_path.write_text('{"schema": "hpcsched.control/1", "generation": "lots"')
    out = _join(procs)[0]
    assert "ignoring control file" in out and "not valid JSON" in out
    assert '"final_loss"' in out
    a = ctl.read_ack(jd.ack_path, jd.uid)
    assert (a.generation, a.state) == (0, "applied")


@pytest.mark.slow
def test_in_place_shrink_keeps_the_surviving_workers(tmp_path):
    """Two 'nodes' of two workers each; shrinking to one node lets ranks 2-3 leave while ranks
    0-1 keep their processes and state, form a new group, and train on. No Slurm here, so rank
    0's scontrol update fails: the job must say so and carry on at the smaller size."""
    jd = JobDir.create(tmp_path)
    epochs = 3
    procs = _launch(jd, world=4, generation=0, local=8, accum=1, launch=1, epochs=epochs,
                    HPCSCHED_NODES="2", HPCSCHED_WORKERS_PER_NODE="2", HPCSCHED_INPLACE_SHRINK="1",
                    SLURM_JOB_ID="0")
    _wait_ack(jd, 0, "applied", procs)
    _control(jd, 1, "checkpoint-and-shrink", world=2, local=16, accum=1, nodes=1)
    a = _wait_ack(jd, 1, "applied", procs)
    assert (a.world_size, a.nodes, a.global_batch_size) == (2, 1, 32)
    assert "Slurm kept the nodes" in a.message
    out = _join(procs)
    assert '"final_loss"' in out[0]
    assert sorted(p.name for p in (jd.path / "left").iterdir()) == ["g1-rank-2", "g1-rank-3"]
    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs)
    assert {r["launch"] for r in recs} == {1}
    assert {r["rank"] for r in recs if r["generation"] == 1} == {0, 1}
    assert generations(recs)[1] == dict(world_size=2, global_batch_size=32, local_batch_size=16,
                                        accumulation_steps=1)
