"""Each resize a job applies is one line on its own output (issue 34): the generation, its GPUs
and layout, the batch configuration and hpcsched's reason; a relaunch at the same generation
(after Slurm's signal) adds no line."""

from __future__ import annotations

import time

from hpcsched.job.boundary import InForce, Reporter, resize_line
from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import AckState


def _cfg(world=6, local=64, accum=1, nodes=2) -> InForce:
    return InForce(3, nodes, BatchConfig(world, local, accum), 1.0)


def test_the_line():
    assert resize_line(3, _cfg(), {"n1": 4, "n2": 2}, "grow by extend: goodput 1126 -> 4629") == (
        "hpcsched: generation 3: 6 GPU(s) on n1:4,n2:2, global batch 384 (64 x 1 per GPU): "
        "grow by extend: goodput 1126 -> 4629")
    assert resize_line(2, _cfg(4, 16, 2, 1), None, "") == (
        "hpcsched: generation 2: 4 GPU(s) on 1 node(s), global batch 128 (16 x 2 per GPU)")


def test_one_line_per_resize_applied(tmp_path, capsys):
    jd = JobDir.create(tmp_path)
    ctl.write_control(jd.control_path, ctl.Control(
        job_uid=jd.uid, generation=3, action="reform", nodes=2, workers_per_node=4,
        global_batch_size=384, local_batch_size=64, accumulation_steps=1, lr_scale=1.0,
        issued_at=time.time(), reason="grow by extend: goodput 1126 -> 4629 samples/s predicted",
        layout={"n1": 4, "n2": 2}))
    rep, cfg = Reporter(jd, 0, 1000), _cfg()
    rep.ack(AckState.APPLIED, 0, cfg, 0)                     # the first launch: no resize
    rep.ack(AckState.APPLIED, 3, cfg, 10, layout={"n1": 4, "n2": 2})
    rep.ack(AckState.APPLIED, 3, cfg, 11)                    # said already
    rep.ack(AckState.STOPPED, 3, cfg, 20)                    # Slurm's signal, then the relaunch
    rep.ack(AckState.APPLIED, 3, cfg, 20)
    Reporter(jd, 1, 1000).ack(AckState.APPLIED, 4, cfg, 30)   # rank 1 writes nothing
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("hpcsched:")]
    assert lines == ["hpcsched: generation 3: 6 GPU(s) on n1:4,n2:2, global batch 384 (64 x 1 "
                     "per GPU): grow by extend: goodput 1126 -> 4629 samples/s predicted"]
