"""The DDP classifier example (ElasticDataLoader + ElasticDDP) with real torch.distributed
(gloo) processes, no Slurm: a batch change in place, an in-place shrink from 4 workers to 2
(a world-size change without restarting the workers that stay: their DataLoaders restart on the
new cut and DDP wraps the model again), then a checkpoint-and-shrink to 1 worker relaunched
from the checkpoint (a requeue). Every sample of every epoch exactly once, from the job's own
records."""

import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.protocol.jobdir import JobDir
from tests.gloo_workers import free_port, join, wait_ack, worker_env, write_control
from tests.jobrecords import check_exactly_once, generations, load_records

EXAMPLE = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "ddp_classifier.py"
DIGITS = 1797


def _launch(jd, world, generation, local, accum, launch, epochs, **extra):
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--epochs", str(epochs), "--batch-time", "0.004",
         "--workers", "1"],
        env=worker_env(jd, rank, world, port, generation, local, accum, launch,
                       HPCSCHED_RECORD_SAMPLES="1", **extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]


@pytest.mark.slow
def test_ddp_classifier_exactly_once_across_batch_and_world_size_changes(tmp_path):
    jd = JobDir.create(tmp_path)
    epochs = 5
    procs = _launch(jd, 4, 0, 8, 1, 1, epochs, HPCSCHED_NODES="2", HPCSCHED_WORKERS_PER_NODE="2",
                    HPCSCHED_INPLACE_SHRINK="1", SLURM_JOB_ID="0")
    wait_ack(jd, 0, "applied", procs)
    write_control(jd, 1, "continue", world=4, local=4, accum=2)        # same batch, new split
    wait_ack(jd, 1, "applied", procs)
    write_control(jd, 2, "checkpoint-and-shrink", world=2, local=8, accum=2, nodes=1)
    a2 = wait_ack(jd, 2, "applied", procs)                             # in place: 4 -> 2 workers
    assert (a2.world_size, a2.global_batch_size) == (2, 32)
    write_control(jd, 3, "checkpoint-and-shrink", world=1, local=16, accum=2)
    wait_ack(jd, 3, "checkpointed", procs)
    join(procs)

    procs = _launch(jd, 1, 3, 16, 2, 2, epochs)                       # relaunched from it
    out = join(procs)[0]
    assert '"final_loss"' in out and '"train_accuracy"' in out

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs)
    gens = generations(recs)
    assert [gens[g]["world_size"] for g in range(4)] == [4, 4, 2, 1]
    assert [(gens[g]["local_batch_size"], gens[g]["accumulation_steps"]) for g in range(4)] == \
        [(8, 1), (4, 2), (8, 2), (16, 2)]
    assert {r["launch"] for r in recs if r["generation"] in (0, 1, 2)} == {1}
    assert {r["rank"] for r in recs if r["generation"] == 2} == {0, 1}
    assert all(r["grad_sqr"] is not None for r in recs if r["step"] > 20)  # measured by the hook
