"""The daemon's side of the GPU probes (issue 13, part 2): ingesting probe files into a real
SQLite store, bad files moved aside, the slow-GPU decision, draining, ``status --gpus``."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from hpcsched.daemon import status
from hpcsched.daemon.config import ProbeSettings
from hpcsched.daemon.gpu_status import gpu_cells, gpu_rows
from hpcsched.daemon.probes import REJECTED, ProbeWatch, ingest_spool, peer_ratios, slow_gpus
from hpcsched.daemon.store import GpuProbeRow
from hpcsched.protocol.files import write_json_atomic
from hpcsched.protocol.probes import GpuScore, ProbeRecord, file_name


def _record(node="n1", job="42", scores=(100.0, 100.0), kind="cpu-stand-in", t=1000.0,
            uuid=False, model="") -> dict:
    unit = "GFLOP/s" if kind == "cpu-stand-in" else "TFLOP/s"
    gpus = tuple(GpuScore(index=str(i), score=s, unit=unit, seconds=1.0, model=model,
                          uuid=f"GPU-{node}-{i}" if uuid else "") for i, s in enumerate(scores))
    return ProbeRecord(node=node, job_id=job, time=t, kind=kind, gpus=gpus).to_json()


def _drop(spool, rec: dict) -> None:
    spool.mkdir(exist_ok=True)
    write_json_atomic(spool / file_name(rec["node"], rec["job_id"]), rec)


def _probe(node, idx, score, kind="cuda", model="H100", t=1.0, uuid=None) -> GpuProbeRow:
    return GpuProbeRow(id=0, time=t, node=node, gpu_index=str(idx), gpu_uuid=uuid, model=model,
                       kind=kind, score=score, unit="TFLOP/s", seconds=1.0, job_id="1")


# -- ingestion ----------------------------------------------------------------------------------


def test_probe_files_are_stored_then_deleted(store, tmp_path):
    spool = tmp_path / "spool"
    _drop(spool, _record("n1", "42", (100.0, 90.0)))
    _drop(spool, _record("n2", "42", (50.0,), kind="cuda", uuid=True, model="H100"))
    (spool / ".n3-42.json.abc.tmp").write_text("{")     # a prolog still writing
    res = ingest_spool(store, spool, now=2000.0)
    assert (res.rows, res.files, res.rejected) == (3, 2, [])
    assert sorted(p.name for p in spool.iterdir()) == [".n3-42.json.abc.tmp"]
    rows = store.latest_gpu_probes()
    assert [(r.node, r.gpu_index, r.gpu_uuid, r.kind, r.score, r.unit, r.job_id) for r in rows] == [
        ("n1", "0", None, "cpu-stand-in", 100.0, "GFLOP/s", "42"),
        ("n1", "1", None, "cpu-stand-in", 90.0, "GFLOP/s", "42"),
        ("n2", "0", "GPU-n2-0", "cuda", 50.0, "TFLOP/s", "42"),
    ]
    assert ingest_spool(store, spool, now=2000.0).rows == 0          # nothing twice


def test_latest_probe_per_gpu(store, tmp_path):
    spool = tmp_path / "spool"
    _drop(spool, _record("n1", "1", (100.0, 100.0), t=10.0))
    ingest_spool(store, spool)
    _drop(spool, _record("n1", "2", (60.0,), t=20.0))          # GPU 0 again, later
    _drop(spool, _record("n1", "3", (999.0,), t=5.0))          # an older probe ingested late
    ingest_spool(store, spool)
    assert [(r.gpu_index, r.score, r.job_id) for r in store.latest_gpu_probes()] == [
        ("0", 60.0, "2"), ("1", 100.0, "1")]


@pytest.mark.parametrize("name, content, why", [
    ("n1-1.json", b"{not json", "not JSON"),
    ("n1-2.json", b"\xff\xfe", "not JSON"),
    ("n1-3.json", json.dumps({**_record(), "schema": "other/9"}).encode(), "schema"),
    ("n1-4.json", json.dumps(_record(scores=(-1.0,))).encode(), "score"),
    ("n1-5.json", json.dumps(_record(kind="tpu")).encode(), "kind"),
    ("n1-6.json", json.dumps({**_record(), "node": "../etc"}).encode(), "node"),
    ("n1-7.json", json.dumps({**_record(), "gpus": [{"index": "0", "score": 1.0, "unit": "TFLOP/s",
                                                     "seconds": 1}]}).encode(), "unit"),
    ("n1-8.json", b"[]", "not a JSON object"),
    ("n1-9.json", b" " * (300 << 10), "larger than 262144 bytes"),
])
def test_a_bad_file_is_moved_aside_and_the_rest_ingested(store, tmp_path, caplog, name, content, why):
    spool = tmp_path / "spool"
    _drop(spool, _record("n2", "5", (10.0,)))
    (spool / name).write_bytes(content)
    res = ingest_spool(store, spool)
    assert res.rows == 1 and [n for n, _ in res.rejected] == [name]
    assert why in res.rejected[0][1]
    assert (spool / REJECTED / name).read_bytes() == content
    assert sorted(p.name for p in spool.iterdir()) == [REJECTED]
    assert why in caplog.text and name in caplog.text


def test_a_symlink_or_fifo_is_refused(store, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(_record()))
    (spool / "n1-1.json").symlink_to(secret)
    os.mkfifo(spool / "n1-2.json")
    res = ingest_spool(store, spool)
    assert res.rows == 0 and sorted(n for n, _ in res.rejected) == ["n1-1.json", "n1-2.json"]
    assert secret.exists()


def test_no_spool_directory_is_an_empty_pass(store, tmp_path):
    res = ingest_spool(store, tmp_path / "missing")
    assert (res.rows, res.files, res.rejected) == (0, 0, [])


def test_a_record_of_a_failed_probe_is_logged(store, tmp_path, caplog):
    spool = tmp_path / "spool"
    rec = ProbeRecord(node="n1", job_id="9", time=1.0, kind="cuda", gpus=(),
                      errors=("RuntimeError: torch sees no CUDA device",)).to_json()
    _drop(spool, rec)
    res = ingest_spool(store, spool)
    assert (res.rows, res.files) == (0, 1)
    assert "GPU probe of job 9 on n1 failed: RuntimeError: torch sees no CUDA device" in caplog.text


# -- the slow-GPU decision (pure) ---------------------------------------------------------------


@pytest.mark.parametrize("probes, fraction, min_peers, slow", [
    # one GPU at 0.55x the median of its 3 peers
    ([_probe("n1", 0, 100), _probe("n1", 1, 100), _probe("n2", 0, 110), _probe("n2", 1, 55)],
     0.8, 2, [("n2", "1", 0.55)]),
    # at the threshold: not slow (strictly below)
    ([_probe("n1", 0, 100), _probe("n1", 1, 100), _probe("n1", 2, 80)], 0.8, 2, []),
    # too few peers to judge
    ([_probe("n1", 0, 100), _probe("n1", 1, 10)], 0.8, 2, []),
    ([_probe("n1", 0, 100), _probe("n1", 1, 10)], 0.8, 1, [("n1", "1", 0.1)]),
    # other models and kinds are not peers
    ([_probe("n1", 0, 100), _probe("n1", 1, 100), _probe("n2", 0, 30, model="V100"),
      _probe("n3", 0, 20, kind="cpu-stand-in", model="")], 0.8, 1, []),
    # slowest first; a slow peer does not drag the median (median of peers, not mean)
    ([_probe("n1", i, s) for i, s in enumerate((100, 100, 100, 10, 50))], 0.8, 2,
     [("n1", "3", 0.1), ("n1", "4", 0.5)]),
])
def test_slow_gpus(probes, fraction, min_peers, slow):
    got = slow_gpus(probes, fraction, min_peers)
    assert [(s.probe.node, s.probe.gpu_index, round(s.ratio, 3)) for s in got] == slow


def test_peer_ratio_and_the_drain_reason():
    probes = [_probe("n1", 0, 100, uuid="GPU-a"), _probe("n1", 1, 100, uuid="GPU-b"),
              _probe("n1", 2, 55, uuid="GPU-c")]
    r = peer_ratios(probes)["GPU-c"]
    assert (r.ratio, r.peer_median, r.peers) == (0.55, 100, 2)
    assert r.reason() == ("hpcsched: GPU 2 at 0.55x its peers' median (probe of job 1: 55.0 vs "
                          "100.0 TFLOP/s, 2 peers)")


# -- the per-round driver -----------------------------------------------------------------------


def _watch(store, spool, drains, **settings):
    return ProbeWatch(ProbeSettings(spool_dir=str(spool), **settings), store,
                      drain=lambda node, reason: drains.append((node, reason)))


@pytest.mark.parametrize("drain_slow, drained", [(False, []), (True, ["n2"])])
def test_a_slow_gpu_is_reported_and_drained_when_enabled(store, tmp_path, caplog, drain_slow, drained):
    spool, drains = tmp_path / "spool", []
    _drop(spool, _record("n1", "1", (100.0, 100.0)))
    _drop(spool, _record("n2", "1", (100.0, 40.0)))
    watch = _watch(store, spool, drains, drain_slow=drain_slow)
    rep = watch.round()
    assert [(s.probe.node, s.probe.gpu_index) for s in rep.slow] == [("n2", "1")]
    assert "slow GPU on n2: hpcsched: GPU 1 at 0.40x its peers' median" in caplog.text
    assert [n for n, _ in drains] == drained == list(rep.drained)
    assert all(r.startswith("hpcsched: GPU 1 at 0.40x") for _, r in drains)
    # judged once per probe: the next round, with no new probe, neither reports nor drains
    caplog.clear()
    assert watch.round().slow == [] and len(drains) == len(drained)
    assert "slow GPU" not in caplog.text


def test_dry_run_never_drains(store, tmp_path, caplog):
    spool, drains = tmp_path / "spool", []
    _drop(spool, _record("n1", "1", (100.0, 100.0, 10.0)))
    watch = ProbeWatch(ProbeSettings(spool_dir=str(spool), drain_slow=True), store, dry_run=True,
                       drain=lambda node, reason: drains.append(node))
    assert [s.probe.gpu_index for s in watch.round().slow] == ["2"] and drains == []
    assert "dry run: would drain n1" in caplog.text


def test_a_failed_drain_is_logged_not_raised(store, tmp_path, caplog):
    from hpcsched.slurm.errors import SlurmError

    def refuse(node, reason):
        raise SlurmError("scontrol update: Invalid user id")

    spool = tmp_path / "spool"
    _drop(spool, _record("n1", "1", (100.0, 100.0, 10.0)))
    rep = ProbeWatch(ProbeSettings(spool_dir=str(spool), drain_slow=True), store, drain=refuse).round()
    assert rep.drained == {} and "cannot drain n1: scontrol update: Invalid user id" in caplog.text


def test_an_empty_spool_setting_ingests_nothing(store, tmp_path):
    spool = tmp_path / "spool"
    _drop(spool, _record())
    assert ProbeWatch(ProbeSettings(spool_dir=""), store).round().ingest.rows == 0
    assert (spool / "n1-42.json").exists()


# -- status --gpus ------------------------------------------------------------------------------


def _with_probes_and_speeds(store, tmp_path):
    spool = tmp_path / "spool"
    _drop(spool, _record("n1", "1", (100.0, 100.0), t=1000.0))
    _drop(spool, _record("n2", "1", (100.0, 40.0), t=1000.0))
    ingest_spool(store, spool)
    store.upsert_job(job_id="1", job_uid="u1", workers_per_node=2, min_nodes=1, max_nodes=2,
                     min_batch_size=8, max_batch_size=64, base_batch_size=16)
    store.add_gpu_measurements([
        dict(job_id="1", time=1.0, node="n1", local_rank=0, gpu_index="0", relative_speed=1.1),
        dict(job_id="1", time=1.0, node="n3", local_rank=0, gpu_index="1", relative_speed=0.9)])


def test_gpu_rows_join_probes_and_passive_speeds(store, tmp_path):
    _with_probes_and_speeds(store, tmp_path)
    rows = gpu_rows(store, ProbeSettings())
    assert [(r.node, r.gpu_index, r.score, r.vs_peers, r.relative_speed, r.slow) for r in rows] == [
        ("n1", "0", 100.0, 1.0, 1.1, False),
        ("n1", "1", 100.0, 1.0, None, False),
        ("n2", "0", 100.0, 1.0, None, False),
        ("n2", "1", 40.0, 0.4, None, True),
        ("n3", "1", None, None, 0.9, False),       # measured passively, never probed
    ]
    assert gpu_cells(rows[3])[3:] == ("cpu-stand-in", "40.0 GFLOP/s", "0.40x (3)", "-",
                                      gpu_cells(rows[3])[7], "SLOW")
    assert gpu_cells(rows[4]) == ("n3", "1", "-", "-", "-", "-", "0.90", "-", "")


def test_status_gpus_table_and_json(store, tmp_path, monkeypatch):
    _with_probes_and_speeds(store, tmp_path)
    monkeypatch.setenv("HPCSCHED_CONFIG", str(tmp_path / "hpcsched.toml"))
    (tmp_path / "hpcsched.toml").write_text(
        f'[daemon]\ndatabase_url = "{store.url}"\n[probe]\nslow_fraction = 0.3\n')
    r = CliRunner().invoke(status.status_command, ["--gpus", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["slow_fraction"] == 0.3 and doc["min_peers"] == 2
    assert [(g["node"], g["gpu_index"], g["kind"], g["score"], g["slow"]) for g in doc["gpus"]][3:] == [
        ("n2", "1", "cpu-stand-in", 40.0, False), ("n3", "1", "", None, False)]
    r = CliRunner().invoke(status.status_command, ["--gpus"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "GPUs (slow: below 0.3x the median of at least 2 peers)" in lines[0]
    assert lines[1].split() == ["NODE", "GPU", "UUID", "KIND", "SCORE", "VS", "PEERS", "PASSIVE",
                                "PROBED", "SLOW"]
    assert lines[5].split()[:7] == ["n2", "1", "-", "cpu-stand-in", "40.0", "GFLOP/s", "0.40x"]
    assert "not the GPUs'" in r.output


def test_status_gpus_without_a_store(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCSCHED_CONFIG", str(tmp_path / "hpcsched.toml"))
    (tmp_path / "hpcsched.toml").write_text(f'[daemon]\ndatabase_url = "sqlite:///{tmp_path}/none.db"\n')
    r = CliRunner().invoke(status.status_command, ["--gpus"])
    assert r.exit_code == 0 and "no GPU probed or measured yet" in r.output
    doc = json.loads(CliRunner().invoke(status.status_command, ["--gpus", "--json"]).output)
    assert doc["gpus"] == []



def test_drain_node_runs_scontrol_update(tmp_path, monkeypatch):
    from hpcsched.slurm import commands
    from hpcsched.slurm.errors import SlurmError

    log = tmp_path / "argv"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done > {log}\n'
                    '[ "$2" = NodeName=bad ] && { echo "Invalid node name specified" >&2; exit 1; }\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    commands.drain_node("n2", "hpcsched: GPU 1 at 0.40x its peers' median")
    assert log.read_text().splitlines() == ["update", "NodeName=n2", "State=DRAIN",
                                            "Reason=hpcsched: GPU 1 at 0.40x its peers' median"]
    with pytest.raises(SlurmError, match="Invalid node name"):
        commands.drain_node("bad", "x")
    with pytest.raises(ValueError):
        commands.drain_node("n2", "")
