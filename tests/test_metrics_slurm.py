"""The daemon's Prometheus endpoint on the real dev cluster (issue 13: "curl of the metrics
endpoint during a daemon run shows the series with sane values; a test parses it").

One elastic job (1 node of 2 GPUs, may grow to 2) runs beside a foreign job holding n3 and n4;
the daemon runs with ``daemon.metrics_port`` set; ``/metrics`` is fetched during the run and
parsed with prometheus_client's parser until the job's measured throughput shows, then every
series is checked against what Slurm and the store say.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcsched import slurm
from tests.conftest import EXAMPLE, start_daemon, stop_daemon, submit, wait_for
from tests.gloo_workers import free_port

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def scrape(port: int) -> dict[tuple[str, tuple], float] | None:
    """``/metrics`` as ``(sample name, sorted labels) -> value``; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_endpoint_during_a_daemon_run(daemon_env, blocker, slurm_jobs):
    tmp_path, _db = daemon_env
    port = free_port()
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace("[daemon]\n", f"[daemon]\nmetrics_port = {port}\n"))
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
                 "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "40",
                 "--sample-time", "0.002")
    slurm_jobs.append(job)
    proc = start_daemon(tmp_path)
    measured = ("hpcsched_job_measured_throughput_samples_per_second", (("job_id", job),))
    try:
        m = wait_for(lambda: (s := scrape(port)) and measured in s and s, 240,
                     f"/metrics to show job {job}'s measured throughput", interval=2)
        # per-GPU speeds and the throughput model (hence the predicted throughput) come from
        # the job's per-rank metrics files, ingested a round or more later
        predicted = ("hpcsched_job_predicted_throughput_samples_per_second", (("job_id", job),))
        m = wait_for(lambda: (s := scrape(port)) and predicted in s and measured in s and any(
            k[0] == "hpcsched_gpu_relative_speed_ratio" for k in s) and s, 120,
            "/metrics to show per-GPU relative speeds and the predicted throughput", interval=2)
        running = slurm.job_info(job)
    finally:
        stop_daemon(proc)
    log = (tmp_path / "daemon.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert f"Prometheus metrics at http://127.0.0.1:{port}/metrics" in log

    def one(name, **labels):
        return m[(name, tuple(sorted(labels.items())))]

    rounds = one("hpcsched_round_duration_seconds_count")
    assert rounds >= 2
    assert 0 < one("hpcsched_round_duration_seconds_sum") / rounds < 20
    # each round observes with squeue + sinfo: at least 2 Slurm calls a round
    assert one("hpcsched_slurm_calls_total", during="round") >= 2 * rounds
    assert one("hpcsched_policy_decision_seconds_count") >= 1
    assert one("hpcsched_errors_total", kind="slurm") == 0
    assert one("hpcsched_errors_total", kind="metrics") == 0
    assert one("hpcsched_jobs", state="RUNNING") >= 1
    assert one("hpcsched_gpus_held") >= 2
    # usable GPUs count allocated ones too: the job's and the blocker's 8 at least
    assert one("hpcsched_gpus_usable") >= one("hpcsched_gpus_held") + 8
    assert 0 < m[measured] < 1e6
    assert 0 < m[predicted] < 1e6
    speeds = {k[1]: v for k, v in m.items() if k[0] == "hpcsched_gpu_relative_speed_ratio"}
    assert speeds and all(0.1 < v < 10 for v in speeds.values()), speeds
    # measured on the nodes the job ran on (n3 and n4 are the blocker's)
    assert {dict(k)["node"] for k in speeds} <= {"n1", "n2"}, speeds
    assert running is not None and running.state in ("RUNNING", "COMPLETED", "COMPLETING")
    decisions = {k[1]: v for k, v in m.items() if k[0] == "hpcsched_resizes_total"}
    # every kind x outcome is exported (at 0 until it happens); a daemon that acts made no
    # dry-run decision
    assert {dict(k)["outcome"] for k in decisions} == {"applied", "refused", "failed"}
