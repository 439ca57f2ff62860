"""Issue 14 on the real dev cluster: the standard DDP + DataLoader script made elastic by the
documented diff (``jobscripts/examples/ddp_classifier.py``) is grown onto another node through
an extension allocation, its extension moved to a third node, and shrunk back, without a worker
restarted; the job's own records show every sample of every epoch processed exactly once."""

from __future__ import annotations

import json

import pytest

from hpcsched import slurm
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import ROOT, cli, paced, unpace, wait_for
from tests.jobrecords import check_exactly_once, generations, load_records

#: a margin for a loaded machine (the job must not end before its last resize applies); paced,
#: so once the resizes are done the rest runs at the model's own speed
DIGITS, EPOCHS = 1797, 60
SCRIPT = ROOT / "jobscripts" / "examples" / "ddp_classifier.py"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_ddp_dataloader_script_grown_moved_and_shrunk_processes_every_sample_once(
        devcluster, control_dir, tmp_path, slurm_jobs):
    job_id = cli("hpcsub", "--parsable", "-N", "1", "-w", "n1", "--gres=gpu:2",
                 f"--output={tmp_path}/slurm-%j.out", "--hpcsched-min-gpus", "2",
                 "--hpcsched-max-nodes", "3", "--hpcsched-batch-size", "64",
                 "--hpcsched-max-batch-size", "512", "--hpcsched-record-samples",
                 *paced(tmp_path / "unpaced", SCRIPT),
                 "--epochs", str(EPOCHS), "--batch-time", "0.02", cwd=tmp_path).stdout.strip()
    slurm_jobs.append(job_id)
    jd = JobDir.for_job(job_id)
    wait_for(lambda: jd.ack_path.exists(), 120, f"job {job_id} to start training")

    steps = [("n1:2,n2:2", 4), ("n1:2,n3:2", 4), ("n1:2", 2)]
    for generation, (layout, gpus) in enumerate(steps, start=1):
        out = cli("hpcsched", "resize", job_id, "--layout", layout, "--reason",
                  f"test: {layout}").stdout
        assert f"generation {generation} in force" in out, out
        ack = ctl.read_ack(jd.ack_path, jd.uid)
        assert (ack.generation, ack.state, ack.world_size) == (generation, "applied", gpus), ack
        assert "no worker restarted" in ack.message

    unpace(tmp_path / "unpaced")
    log = tmp_path / f"slurm-{job_id}.out"
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and not i.active and i, 300,
                     f"job {job_id} to finish\n{log.read_text() if log.exists() else ''}",
                     interval=0.5)
    assert final.state == "COMPLETED", log.read_text()[-3000:]

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, EPOCHS)
    assert [g["world_size"] for g in generations(recs).values()] == [2, 4, 4, 2]
    nodes = {(r["generation"], r["device"]["node"]) for r in recs}
    assert {(1, "n2"), (2, "n3")} <= nodes and not any(n != "n1" for g, n in nodes if g == 3)
    for f in jd.metrics_dir.iterdir():   # one process per file: no worker restarted
        pids = {json.loads(line)["pid"] for line in f.read_text().splitlines()}
        assert len(pids) == 1, (f.name, pids)
    result = json.loads([line for line in log.read_text().splitlines()
                         if line.startswith('{"final_loss"')][-1])
    assert result["train_accuracy"] > 0.9, result   # it learned, across every change
