"""The daemon's Prometheus metrics (hpcsched/daemon/metrics.py): the recorder fed with round
reports, its HTTP endpoint fetched and parsed as Prometheus would, the ``--metrics-port``
option and configuration keys, and whole daemon rounds (fake Slurm, real round code) with
metrics on. The same endpoint during a real daemon run on the dev cluster:
``tests/test_metrics_slurm.py``."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from hpcsched import __version__, slurm
from hpcsched.daemon import config as cfg
from hpcsched.daemon import round as daemon_round
from hpcsched.daemon.actuator import Actuator
from hpcsched.daemon.gpu_status import GpuStatus
from hpcsched.daemon.metrics import DaemonMetrics, outcome_of, predicted_throughput
from hpcsched.daemon.phases import Timeouts
from hpcsched.daemon.round import RoundReport
from hpcsched.daemon.service import daemon_command
from hpcsched.daemon.store import Store
from hpcsched.model.snapshot import ClusterSnapshot, GPUView, JobView, NodeView, ProfilePoint
from hpcsched.policies.reconcile import Change
from hpcsched.policies.round import RoundDecision
from hpcsched.protocol import files as ctl
from hpcsched.protocol.limits import JobLimits
from tests.test_daemon_round_nonblocking import FakeCluster, answer, info, make_job


def job(job_id, state="RUNNING", nodes=1, wpn=2, throughput=0.0, app="cifar10", profile=()):
    return JobView(job_id=job_id, state=state, nodes=nodes, node_names=(),
                   limits=JobLimits(wpn, 1, 4, 64, 1024, None, 128, "linear"), batch_size=128,
                   submit_time=0.0, throughput=throughput, app_class=app, profile=profile)


def snapshot(*jobs, gpus=()):
    nodes = (NodeView("n1", 4, 4, "allocated"), NodeView("n2", 4, 0, "idle"),
             NodeView("n3", 4, 0, "down"))
    return ClusterSnapshot(time=0.0, nodes=nodes, jobs=tuple(jobs), gpus=tuple(gpus))


def report(rid=1, **kw) -> RoundReport:
    rep = RoundReport(rid, time.time(), duration=0.4, policy_seconds=0.02)
    for k, v in kw.items():
        setattr(rep, k, v)
    return rep


def value(m: DaemonMetrics, name, **labels):
    return m.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("phase, outcome", [
    ("running", "applied"),
    ("failed: job 7 rejected generation 3: batch size 5000 over the job's limit", "refused"),
    ("failed: job 7: generation 3 was superseded by 4", "failed"),
    ("failed: job no longer known to Slurm", "failed"),
    ("requested", None), ("checkpointed", None), ("requeued", None), ("interrupted", None),
])
def test_outcome_of_a_resize_step(phase, outcome):
    assert outcome_of(phase) == outcome


def test_a_round_report_becomes_the_series():
    m = DaemonMetrics()
    prof = (ProfilePoint(2, 1, 64, 1, 0.5, 256.0, 10),)
    snap = snapshot(job("7", throughput=250.0, profile=prof), job("8", nodes=2, throughput=0.0),
                    job("9", state="PENDING"),
                    gpus=[GPUView("n1", 0, (("cifar10", 1.25),)), GPUView("n1", 1, (("cifar10", 0.8),))])
    m.record_round(report(outcomes={"7": "running", "8": "failed: job 8 rejected generation 2: no",
                                    "10": "checkpointed", "11": "interrupted"},
                          kinds={"7": "batch", "8": "shrink", "10": "grow", "11": "grow"},
                          slurm_states={"7": "RUNNING", "8": "RUNNING", "9": "PENDING",
                                        "12": "COMPLETED"},
                          snapshot=snap,
                          gpus=[GpuStatus("n1", "0", kind="cuda", score=612.5, unit="TFLOP/s",
                                          vs_peers=0.98),
                                GpuStatus("n2", "1", kind="cpu-stand-in", score=41.0,
                                          unit="GFLOP/s"),
                                GpuStatus("n3", "0", relative_speed=1.1)]))   # never probed
    assert value(m, "hpcsched_round_duration_seconds_count") == 1
    assert value(m, "hpcsched_round_duration_seconds_sum") == pytest.approx(0.4)
    assert value(m, "hpcsched_policy_decision_seconds_sum") == pytest.approx(0.02)
    assert value(m, "hpcsched_resizes_total", kind="batch", outcome="applied") == 1
    assert value(m, "hpcsched_resizes_total", kind="shrink", outcome="refused") == 1
    assert value(m, "hpcsched_resizes_in_flight", kind="grow") == 2
    assert value(m, "hpcsched_errors_total", kind="resize_interrupted") == 1
    assert value(m, "hpcsched_errors_total", kind="resize_failed") == 1
    assert value(m, "hpcsched_errors_total", kind="slurm") == 0
    assert {s: value(m, "hpcsched_jobs", state=s) for s in ("RUNNING", "PENDING", "COMPLETED")} \
        == {"RUNNING": 2, "PENDING": 1, "COMPLETED": 1}
    assert value(m, "hpcsched_gpus_held") == 2 + 4       # running jobs only
    assert value(m, "hpcsched_gpus_usable") == 8         # n3 is down
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="7") == 250.0
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="8") is None
    predicted = value(m, "hpcsched_job_predicted_throughput_samples_per_second", job_id="7")
    assert predicted == pytest.approx(predicted_throughput(snap.jobs[0])) and predicted > 0
    assert value(m, "hpcsched_job_predicted_throughput_samples_per_second", job_id="9") is None
    assert value(m, "hpcsched_gpu_relative_speed_ratio", node="n1", gpu="0", app_class="cifar10") == 0.8
    assert value(m, "hpcsched_gpu_relative_speed_ratio", node="n1", gpu="1", app_class="cifar10") == 1.25
    assert value(m, "hpcsched_last_round_timestamp_seconds") == pytest.approx(time.time(), abs=5)
    assert value(m, "hpcsched_gpu_probe_flops", node="n1", gpu="0", kind="cuda") == 612.5e12
    assert value(m, "hpcsched_gpu_probe_flops", node="n2", gpu="1", kind="cpu-stand-in") == 41.0e9
    assert value(m, "hpcsched_gpu_probe_vs_peers_ratio", node="n1", gpu="0") == 0.98
    assert value(m, "hpcsched_gpu_probe_vs_peers_ratio", node="n2", gpu="1") is None
    assert not [x for f in m.registry.collect() if f.name == "hpcsched_gpu_probe_flops"
                for x in f.samples if x.labels["node"] == "n3"]


def test_series_of_ended_jobs_and_finished_resizes_are_removed():
    m = DaemonMetrics()
    m.record_round(report(outcomes={"7": "requested"}, kinds={"7": "grow"},
                          slurm_states={"7": "RUNNING", "8": "COMPLETING"},
                          snapshot=snapshot(job("7", throughput=10.0), job("8", throughput=20.0))))
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="8") == 20.0
    assert value(m, "hpcsched_jobs", state="COMPLETING") == 1
    m.record_round(report(2, outcomes={"7": "running"}, kinds={"7": "grow"},
                          slurm_states={"7": "RUNNING"}, snapshot=snapshot(job("7", throughput=30.0))))
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="8") is None
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="7") == 30.0
    assert value(m, "hpcsched_jobs", state="COMPLETING") is None
    assert value(m, "hpcsched_jobs", state="PENDING") == 0, "the base states stay, at 0"
    assert value(m, "hpcsched_resizes_in_flight", kind="grow") is None
    assert value(m, "hpcsched_resizes_total", kind="grow", outcome="applied") == 1


def test_a_dry_run_counts_its_changes_and_a_failed_round_only_the_error():
    m = DaemonMetrics()
    changes = [Change("7", "grow", 1, 2, 64, 64, "r"), Change("8", "batch", 1, 1, 64, 128, "r")]
    m.record_round(report(changes=changes, slurm_states={"7": "RUNNING"},
                          snapshot=snapshot(job("7", throughput=5.0))), dry_run=True)
    assert value(m, "hpcsched_decisions_total", kind="grow", dry_run="true") == 1
    assert value(m, "hpcsched_decisions_total", kind="batch", dry_run="true") == 1
    assert value(m, "hpcsched_decisions_total", kind="grow", dry_run="false") == 0
    assert value(m, "hpcsched_resizes_total", kind="grow", outcome="applied") == 0
    m.record_round(report(2, error="Slurm: squeue did not answer within 20 s", duration=20.0))
    assert value(m, "hpcsched_errors_total", kind="slurm") == 1
    assert value(m, "hpcsched_round_duration_seconds_count") == 2
    assert value(m, "hpcsched_policy_decision_seconds_count") == 1, "no decision in a failed round"
    # a round that observed nothing leaves the last figures (and the series) as they were
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="7") == 5.0


def test_slurm_calls_split_into_the_rounds_and_between_them():
    m = DaemonMetrics()
    slurm.count_call(3)                      # actuation ticks before the round
    slurm.count_call(2)                      # the round's observation
    m.record_round(report(slurm_calls=2))
    assert value(m, "hpcsched_slurm_calls_total", during="round") == 2
    assert value(m, "hpcsched_slurm_calls_total", during="between_rounds") == 3


def test_a_bug_in_the_recorder_is_counted_not_raised(caplog):
    m = DaemonMetrics()
    m.record_round(report(snapshot=object()))    # not a snapshot: the recorder fails
    assert value(m, "hpcsched_errors_total", kind="metrics") == 1
    assert "metrics not recorded" in caplog.text


def test_each_daemon_has_its_own_registry():
    a, b = DaemonMetrics(), DaemonMetrics()
    a.record_round(report())
    assert value(a, "hpcsched_round_duration_seconds_count") == 1
    assert value(b, "hpcsched_round_duration_seconds_count") == 0


def fetch(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_endpoint_serves_the_series_in_prometheus_text_format():
    m = DaemonMetrics()
    port = m.serve(0)
    try:
        prof = (ProfilePoint(2, 1, 64, 1, 0.5, 256.0, 10),)
        m.record_round(report(outcomes={"7": "running"}, kinds={"7": "batch"},
                              slurm_states={"7": "RUNNING"},
                              snapshot=snapshot(job("7", throughput=250.0, profile=prof),
                                                gpus=[GPUView("n1", 0, (("cifar10", 1.0),))])))
        families = fetch(port)
    finally:
        m.close()
    want = {"hpcsched_round_duration_seconds": "histogram", "hpcsched_slurm_calls": "counter",
            "hpcsched_policy_decision_seconds": "histogram", "hpcsched_decisions": "counter",
            "hpcsched_resizes": "counter", "hpcsched_build_info": "gauge",
            "hpcsched_jobs": "gauge", "hpcsched_gpus_held": "gauge",
            "hpcsched_job_measured_throughput_samples_per_second": "gauge",
            "hpcsched_job_predicted_throughput_samples_per_second": "gauge",
            "hpcsched_gpu_relative_speed_ratio": "gauge", "hpcsched_errors": "counter",
            "hpcsched_resizes_in_flight": "gauge", "hpcsched_last_round_timestamp_seconds": "gauge"}
    assert {n: families[n].type for n in want if n in families} == want
    assert all(n.startswith("hpcsched_") for n in families), "nothing from the default registry"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("hpcsched_round_duration_seconds_count", ())] == 1
    assert samples[("hpcsched_resizes_total", (("kind", "batch"), ("outcome", "applied")))] == 1
    assert samples[("hpcsched_build_info", (("version", __version__),))] == 1
    assert samples[("hpcsched_jobs", (("state", "RUNNING"),))] == 1
    assert samples[("hpcsched_gpus_held", ())] == 2
    assert samples[("hpcsched_job_measured_throughput_samples_per_second",
                    (("job_id", "7"),))] == 250.0
    assert 0 < samples[("hpcsched_job_predicted_throughput_samples_per_second",
                        (("job_id", "7"),))] < 1e6
    assert all("help" in f.documentation or f.documentation for f in families.values())


# ------------------------------------------------------------------ configuration and CLI
@pytest.mark.parametrize("text, port, addr", [
    ("", 0, "127.0.0.1"),
    ("metrics_port = 9464\n", 9464, "127.0.0.1"),
    ('metrics_port = 9464\nmetrics_addr = "0.0.0.0"\n', 9464, "0.0.0.0"),
])
def test_metrics_settings(tmp_path, text, port, addr):
    f = tmp_path / "h.toml"
    f.write_text("[daemon]\n" + text)
    d = cfg.load(f, env={}).daemon
    assert (d.metrics_port, d.metrics_addr) == (port, addr)


@pytest.mark.parametrize("text, expected", [
    ("metrics_port = 70000", "a TCP port"), ("metrics_port = -1", "a TCP port"),
    ('metrics_port = "9464"', "a TCP port"), ("metrics_port = true", "a TCP port"),
    ('metrics_addr = ""', "a non-empty string"),
])
def test_bad_metrics_settings_are_one_line_errors(tmp_path, text, expected):
    f = tmp_path / "h.toml"
    f.write_text("[daemon]\n" + text + "\n")
    with pytest.raises(cfg.ConfigError, match=expected) as e:
        cfg.load(f, env={})
    assert "\n" not in str(e.value)


@pytest.fixture
def daemon_config(tmp_path, control_dir, monkeypatch):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    f = tmp_path / "hpcsched.toml"
    f.write_text(f'[daemon]\ncontrol_dir = "{control_dir}"\nlock_file = "{tmp_path}/d.lock"\n'
                 f'database_url = "sqlite:///{tmp_path / "h.db"}"\n[policy]\nname = "static"\n')
    return f


def test_a_port_in_use_is_one_error_line(daemon_config):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(daemon_command, ["--config", str(daemon_config), "--once",
                                                  "--metrics-port", str(port)])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines() == [
        f"Error: metrics endpoint: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in res.output


def test_the_daemon_command_serves_metrics_from_its_rounds(daemon_config, monkeypatch):
    """``hpcsched daemon --once --metrics-port``: the endpoint is started before the round and
    the round is recorded (the backend is a fake with no job: no Slurm here)."""
    served = []
    real_serve = DaemonMetrics.serve

    def serve(self, port, addr="127.0.0.1"):
        served.append((self, real_serve(self, 0, addr)))   # an ephemeral port for the test
        return served[-1][1]

    monkeypatch.setattr(DaemonMetrics, "serve", serve)
    monkeypatch.setattr(daemon_round, "make_backend", lambda *a, **k: FakeCluster())
    res = CliRunner().invoke(daemon_command, ["--config", str(daemon_config), "--once",
                                              "--metrics-port", "9464"])
    assert res.exit_code == 0, res.output
    (metrics, port), = served
    try:
        families = fetch(port)
    finally:
        metrics.close()
    rounds = families["hpcsched_round_duration_seconds"].samples
    assert [s.value for s in rounds if s.name.endswith("_count")] == [1]
    assert [s.value for s in families["hpcsched_jobs"].samples] == [0, 0]


# ------------------------------------------------------------------ whole rounds, fake Slurm
@pytest.fixture
def fake_daemon(daemon_config):
    """A daemon with metrics on: the real round, journal and job files, Slurm a fake
    (``tests/test_daemon_round_nonblocking.py``'s)."""

    settings = cfg.load(daemon_config)
    store = Store(settings.daemon.database_url)
    store.upgrade()
    cluster = FakeCluster(info("7"), info("8"))
    metrics = DaemonMetrics()
    d = daemon_round.Daemon(settings, backend=cluster, store=store, metrics=metrics)
    shift = [0.0]
    d.actuator = Actuator(cluster, Timeouts(ack=180, start=300), lambda: time.time() + shift[0])
    yield d, cluster, shift, metrics
    store.close()


def test_rounds_through_the_daemon_record_resizes_until_they_run(fake_daemon, control_dir,
                                                                  monkeypatch):

    d, cluster, shift, m = fake_daemon
    jobs = {"7": make_job(control_dir, "7"), "8": make_job(control_dir, "8")}
    ctl.write_progress(jobs["8"].progress_path, ctl.Progress(
        job_uid=jobs["8"].uid, generation=0, step=10, epoch=0, samples_processed=640,
        epoch_position=640, throughput=321.0, world_size=2, global_batch_size=64,
        time=time.time()))
    changes = (Change("7", "grow", 1, 2, 64, 64, "test: grow"),
               Change("8", "batch", 1, 1, 64, 128, "test: batch"))
    rounds = []
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a, **k: RoundDecision(
        None, changes if not rounds else (), ()))
    rounds.append(d.round())
    assert value(m, "hpcsched_resizes_in_flight", kind=d.store.actions()[-1].kind) >= 1
    assert value(m, "hpcsched_jobs", state="RUNNING") == 2
    assert value(m, "hpcsched_gpus_held") == 4
    assert value(m, "hpcsched_job_measured_throughput_samples_per_second", job_id="8") == 321.0
    for _ in range(8):
        for job_id, jd in jobs.items():
            answer(jd, cluster, job_id)
        shift[0] += 1.5
        rounds.append(d.round())
        if {a.phase for a in d.store.actions()} == {"running"}:
            break
    kinds = {a.kind for a in d.store.actions()}
    assert {a.phase for a in d.store.actions()} == {"running"}
    for kind in kinds:
        assert value(m, "hpcsched_resizes_total", kind=kind, outcome="applied") == 1
        assert value(m, "hpcsched_resizes_in_flight", kind=kind) is None
    assert sum(s.value for f in m.registry.collect() if f.name == "hpcsched_resizes"
               for s in f.samples if s.name.endswith("_total")) == 2, "each resize once"
    assert value(m, "hpcsched_round_duration_seconds_count") == len(rounds)
    assert value(m, "hpcsched_policy_decision_seconds_count") == len(rounds)
    assert value(m, "hpcsched_errors_total", kind="metrics") == 0


def test_resizes_run_between_rounds_are_recorded_too(fake_daemon, control_dir, monkeypatch):

    d, cluster, shift, m = fake_daemon
    jd = make_job(control_dir, "7")
    make_job(control_dir, "8")
    first = [True]

    def decide(*a, **k):
        go, first[0] = first[0], False
        return RoundDecision(None, (Change("7", "grow", 1, 2, 64, 64, "t"),) if go else (), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)
    d.round()
    (kind,) = {a.kind for a in d.store.actions()}
    for _ in range(6):
        answer(jd, cluster, "7")
        shift[0] += 1.5
        if d.actuate().get("7") == "running":
            break
    assert value(m, "hpcsched_resizes_total", kind=kind, outcome="applied") == 1
    assert value(m, "hpcsched_resizes_in_flight", kind=kind) is None
    assert value(m, "hpcsched_round_duration_seconds_count") == 1


# ------------------------------------------------------------------ docs and dashboard
ROOT = Path(__file__).resolve().parent.parent


def series_names() -> set[str]:
    """The exported names of every series (counters with their ``_total``)."""
    m = DaemonMetrics()
    suffix = {"counter": "_total", "info": "_info"}
    return {f.name + suffix.get(f.type, "") for f in m.registry.collect()}


def test_every_series_is_documented():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert {n for n in series_names() if f"`{n}`" not in doc} == set()


def test_the_grafana_dashboard_queries_every_series_and_only_those():
    dash = json.loads((ROOT / "docs" / "grafana-hpcsched.json").read_text())
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert var["query"] == "prometheus"
    ds = "${" + var["name"] + "}"
    exprs = []
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == ds and p["gridPos"]["w"] <= 24, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == ds and t["refId"], p["title"]
            exprs.append(t["expr"])
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs
            for n in re.findall(r"\bhpcsched_[a-z_]+", e)}
    names = series_names()
    assert used - names == set(), "the dashboard queries series that do not exist"
    assert names - used == set(), "series without a panel"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
