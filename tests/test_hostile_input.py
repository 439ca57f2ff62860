"""Hostile input never stops the daemon (issue 12, item 4): whatever a job writes into its job
directory -- random bytes, huge lines, invalid UTF-8, deep JSON, symbolic links (to /etc/passwd,
to another job's files), FIFOs, directories, missing files, impossible metrics -- the daemon's
ingest and view building go on, a healthy job beside the hostile one keeps its view and its
profile rows, and the log names the hostile job. Rounds run on a real store and real job
directories with a fake Slurm (as in ``tests/test_daemon_round_nonblocking.py``)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsched.daemon import round as daemon_round
from hpcsched.daemon import views
from hpcsched.daemon.config import load
from hpcsched.daemon.ingest import MAX_LINE_BYTES, ingest_job
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.test_daemon_round_nonblocking import FakeCluster, info, make_job

HEALTHY, HOSTILE = "7", "8"
FILES = ("control.json", "ack.json", "progress.json", "launcher.json")
METRICS = "metrics/launch-1-rank-0.jsonl"


def records(n: int, rank: int, t0: float) -> list[dict]:
    """``n`` honest steps of a 2-GPU job (one node, batch 64), 0.1 s each, 10 ms apart."""
    return [{"t": t0 + 0.11 * s, "launch": 1, "restart": 0, "generation": 0, "step": s,
             "epoch": 0, "rank": rank, "world_size": 2, "nodes": 1, "local_batch_size": 32,
             "accumulation_steps": 1, "global_batch_size": 64, "global_samples": 64,
             "samples": 32, "step_time": 0.1, "compute_time": 0.05 + 0.01 * rank,
             "device": {"node": "n1", "local_rank": rank, "gpu_index": str(rank),
                        "gpu_uuid": f"GPU-{rank}"}} for s in range(n)]


def write_metrics(jd: JobDir, n: int = 6) -> None:
    t0 = time.time() - 100
    for rank in (0, 1):
        with open(jd.metrics_dir / f"launch-1-rank-{rank}.jsonl", "ab") as fh:
            fh.write(b"".join(json.dumps(r).encode() + b"\n" for r in records(n, rank, t0)))


def replace_with(path: Path, make) -> None:
    """Remove whatever is at ``path`` and make something else there."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    make(path)


def fifo(path: Path) -> None:
    os.mkfifo(path)


# hostile job directories: (what to do to job 8's directory given job 7's, a warning expected)
def random_bytes(jd, other):
    rnd = os.urandom(4096)
    for name in FILES + (METRICS,):
        (jd.path / name).write_bytes(rnd)


def huge_lines(jd, other):
    for name in FILES:
        (jd.path / name).write_bytes(b'{"schema": "' + b"x" * (3 << 20) + b'"}')
    with open(jd.path / METRICS, "wb") as fh:  # 3 MB with no newline, then one over the bound
        fh.write(b"z" * (3 << 20) + b"\n" + b"[" * (MAX_LINE_BYTES + 1) + b"\n")


def invalid_utf8(jd, other):
    for name in FILES:
        (jd.path / name).write_bytes(b'{"schema": "\xff\xfe"}')
    write_metrics(jd)
    with open(jd.path / METRICS, "ab") as fh:
        fh.write(b"\xff\n" + b'{"step": "\xc3\x28"}\n')


def deep_json(jd, other):
    for name in FILES:
        (jd.path / name).write_bytes(b"[" * 200_000 + b"]" * 200_000)
    with open(jd.path / METRICS, "wb") as fh:
        fh.write(b"[" * 30_000 + b"]" * 30_000 + b"\n" + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n")


def links_to_etc_passwd(jd, other):
    for name in FILES + (METRICS,):
        replace_with(jd.path / name, lambda p: p.symlink_to("/etc/passwd"))


def links_to_another_job(jd, other):
    for name in FILES:
        replace_with(jd.path / name, lambda p, n=name: p.symlink_to(other.path / n))
    replace_with(jd.metrics_dir, lambda p: p.symlink_to(other.metrics_dir))


def fifos(jd, other):
    for name in FILES + (METRICS,):
        replace_with(jd.path / name, fifo)


def directories(jd, other):
    for name in FILES + (METRICS,):
        replace_with(jd.path / name, lambda p: p.mkdir())


def missing_files(jd, other):
    for name in FILES:
        (jd.path / name).unlink(missing_ok=True)
    shutil.rmtree(jd.metrics_dir)


def impossible_claims(jd, other):
    honest = records(12, 0, time.time() - 100)
    claims = [
        {**honest[0], "step_time": 1e-9},                      # the group below: far too fast
        {**honest[1], "step_time": 1e-9}, {**honest[2], "step_time": 1e-9},
        {**honest[3], "step_time": -1.0},                      # negative
        {**honest[4], "step_time": math.nan},                  # not finite (NaN in JSON)
        {**honest[5], "world_size": 4},                        # 64 != 4 x 32 x 1
        {**honest[6], "global_samples": 10**6},                # more than the batch
        {**honest[7], "step": "seven"},                        # not a number
        {**honest[8], "t": time.time() + 10**6},               # from the future
        {**honest[9], "device": {"node": "n" * 10_000}},       # longer than the store takes
    ]
    (jd.path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in claims))
    with open(jd.metrics_dir / "launch-1-rank-1.jsonl", "w") as fh:  # steps going backwards
        for s in (5, 6, 3, 2):
            fh.write(json.dumps({**honest[s], "rank": 1}) + "\n")
    ctl.write_progress(jd.progress_path, ctl.Progress(
        job_uid=jd.uid, generation=0, step=2, epoch=0, samples_processed=10**9, epoch_position=0,
        throughput=1.0, world_size=2, global_batch_size=64, time=time.time()))


def wrong_types(jd, other):
    good = json.loads(jd.ack_path.read_text())
    jd.ack_path.write_text(json.dumps({**good, "generation": [1], "step": 2**70}))
    jd.control_path.write_text(json.dumps({"schema": ctl.CONTROL_SCHEMA, "job_uid": jd.uid,
                                           "generation": 1.5}))
    jd.progress_path.write_text(json.dumps({"schema": ctl.PROGRESS_SCHEMA, "job_uid": jd.uid,
                                            "generation": 0, "step": "x", "epoch": None,
                                            "samples_processed": {}, "epoch_position": 0,
                                            "throughput": "fast", "world_size": 2,
                                            "global_batch_size": 64, "time": 0}))
    (jd.path / METRICS).write_text("1\n[]\nnull\n\"s\"\n{}\n" + "9" * 5000 + "\n")


HOSTILE_CASES = {f.__name__.replace("_", " "): f for f in (
    random_bytes, huge_lines, invalid_utf8, deep_json, links_to_etc_passwd, links_to_another_job,
    fifos, directories, impossible_claims, wrong_types)}


@pytest.fixture
def no_hang():
    """Fail, rather than hang, if anything blocks (a FIFO opened for reading without O_NONBLOCK
    waits for a writer forever)."""
    def expired(signum, frame):
        raise TimeoutError("the daemon blocked on a job's file")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def make_daemon(tmp_path, control_dir, store=None) -> tuple[Daemon, Store]:
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\ncontrol_dir = "{control_dir}"\n'
                   f'database_url = "sqlite:///{tmp_path / "h.db"}"\n[policy]\nname = "static"\n')
    settings_ = load(cfg)
    if store is None:
        store = Store(settings_.daemon.database_url)
        store.upgrade()
    return Daemon(settings_, backend=FakeCluster(info(HEALTHY), info(HOSTILE)), store=store), store


@pytest.fixture
def snapshots(monkeypatch):
    """The snapshots the rounds decide on."""
    seen = []
    decide = daemon_round.decide_round

    def recording(snapshot, *a, **kw):
        seen.append(snapshot)
        return decide(snapshot, *a, **kw)

    monkeypatch.setattr(daemon_round, "decide_round", recording)
    return seen


@pytest.mark.parametrize("plant", HOSTILE_CASES.values(), ids=HOSTILE_CASES.keys())
def test_a_hostile_job_directory_stops_neither_the_rounds_nor_the_healthy_job(
        tmp_path, control_dir, monkeypatch, caplog, snapshots, no_hang, plant):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    healthy, hostile = make_job(control_dir, HEALTHY), make_job(control_dir, HOSTILE)
    write_metrics(healthy)
    plant(hostile, healthy)
    d, store = make_daemon(tmp_path, control_dir)
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(2):
            rep = d.round()
            assert rep.error is None
            write_metrics(healthy, 3)
        (row,) = store.profile(HEALTHY)  # the rows of both rounds' passes: 4 + 1 steps past warm-up
        assert (row.steps, row.samples) == (5, 2), "the healthy job's rows, one per round"
        if plant is not invalid_utf8:  # the only case with honest lines among the garbage
            assert store.profile(HOSTILE) == [], "nothing of another job's or the system's files"
    finally:
        store.close()
    for snap in snapshots:
        healthy_view = snap.job(HEALTHY)
        assert healthy_view is not None and not healthy_view.busy
        assert healthy_view.profile, "the healthy job's measurements reach the policy"
        hostile_view = snap.job(HOSTILE)
        assert hostile_view is None or hostile_view.busy
    assert len(snapshots) == 2
    hostile_logs = [r.getMessage() for r in caplog.records if f"job {HOSTILE}" in r.getMessage()]
    assert hostile_logs, "the log names the hostile job"
    assert not [r for r in caplog.records if f"job {HEALTHY}" in r.getMessage()], \
        "nothing is said against the healthy job"


def test_missing_files_make_the_job_busy_and_say_nothing(tmp_path, control_dir, monkeypatch,
                                                        caplog, snapshots):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    healthy, hostile = make_job(control_dir, HEALTHY), make_job(control_dir, HOSTILE)
    write_metrics(healthy)
    missing_files(hostile, healthy)
    d, store = make_daemon(tmp_path, control_dir)
    try:
        assert d.round().error is None
    finally:
        store.close()
    (snap,) = snapshots
    assert snap.job(HEALTHY).profile and not snap.job(HEALTHY).busy
    assert snap.job(HOSTILE).busy, "no acknowledgement yet: busy"


@pytest.mark.parametrize("plant", [fifo, lambda p: p.symlink_to("/etc/passwd"),
                                   lambda p: p.write_bytes(b"[" * 100_000)],
                         ids=["FIFO", "link to /etc/passwd", "deep JSON"])
def test_a_hostile_spec_ignores_that_job_only(tmp_path, control_dir, monkeypatch, caplog,
                                              snapshots, no_hang, plant):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    healthy, hostile = make_job(control_dir, HEALTHY), make_job(control_dir, HOSTILE)
    write_metrics(healthy)
    replace_with(hostile.spec_path, plant)
    d, store = make_daemon(tmp_path, control_dir)
    caplog.set_level(logging.WARNING)
    try:
        assert d.round().error is None
    finally:
        store.close()
    (snap,) = snapshots
    assert [j.job_id for j in snap.jobs] == [HEALTHY]
    assert any(f"job {HOSTILE}: ignored" in r.getMessage() for r in caplog.records)


def test_a_non_utf8_byte_in_metrics_stops_no_daemon_and_is_read_once(tmp_path, control_dir,
                                                                      monkeypatch, caplog):
    """The regression of issue 12: one byte that is not UTF-8 appended to a job's metrics made
    ``hpcsched daemon`` exit with UnicodeDecodeError, and a restarted daemon die again at its
    first round (the offset never moved past it)."""
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    jd = make_job(control_dir, HEALTHY)
    write_metrics(jd)
    path = jd.metrics_dir / "launch-1-rank-0.jsonl"
    with open(path, "ab") as fh:
        fh.write(b"\xff\n")
    caplog.set_level(logging.WARNING)
    d, store = make_daemon(tmp_path, control_dir)
    assert d.round().error is None
    assert store.ingest_offset(str(path)) == path.stat().st_size
    with open(path, "ab") as fh:  # the byte again, now at the start of an honest line
        fh.write(b"\xff" + json.dumps(records(1, 0, time.time())[0]).encode() + b"\n")
    d2, _ = make_daemon(tmp_path, control_dir, store)  # a restarted daemon on the same store
    try:
        assert d2.round().error is None
        assert store.ingest_offset(str(path)) == path.stat().st_size
        assert store.profile(HEALTHY)
    finally:
        store.close()
    skipped = [r.getMessage() for r in caplog.records if "not UTF-8" in r.getMessage()]
    assert len(skipped) == 2 and all(f"job {HEALTHY}" in m and str(path) in m for m in skipped)


# -- property-based: anything in the files, the facts and the ingest never raise ----------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
RECORD_KEYS = tuple(records(1, 0, 0.0)[0])


@st.composite
def metrics_lines(draw) -> bytes:
    """Lines that are random bytes, random JSON, or honest records with random field values."""
    lines = []
    for kind in draw(st.lists(st.sampled_from(["bytes", "json", "record"]), max_size=12)):
        if kind == "bytes":
            lines.append(draw(st.binary(max_size=200)))
        elif kind == "json":
            lines.append(json.dumps(draw(JSON)).encode())
        else:
            rec = records(1, draw(st.integers(0, 2)), time.time() - 50)[0]
            rec["step"] = draw(st.integers(0, 30))
            for key in draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=3)):
                rec[key] = draw(JSON)
            lines.append(json.dumps(rec).encode())
    return b"\n".join(lines) + draw(st.sampled_from([b"", b"\n"]))


@pytest.fixture(scope="module")
def module_store(tmp_path_factory):
    s = Store(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'h.db'}")
    s.upgrade()
    yield s
    s.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.fixed_dictionaries({name: st.none() | st.binary(max_size=300)
                                    | JSON.map(lambda v: json.dumps(v).encode()) for name in FILES}),
       ack_fields=st.dictionaries(st.sampled_from(["generation", "state", "world_size", "step"]), JSON,
                                  max_size=2),
       metrics=st.lists(metrics_lines(), min_size=1, max_size=3))
def test_fuzz_facts_and_ingest_never_raise(module_store, files, ack_fields, metrics):
    root = Path(tempfile.mkdtemp())
    try:
        jd = make_job(root, HOSTILE)
        module_store.upsert_job(job_id=HOSTILE, job_uid=jd.uid, user="bob", script="t.py",
                                workers_per_node=2, min_nodes=1, max_nodes=2, min_batch_size=16,
                                max_batch_size=256, base_batch_size=64, lr_scaling="linear",
                                spec_json="{}", state="RUNNING", last_seen=1.0)
        ack = json.loads(jd.ack_path.read_text())
        jd.ack_path.write_text(json.dumps({**ack, **ack_fields}))
        for name, data in files.items():
            if data is not None:
                (jd.path / name).write_bytes(data)
        for rank, data in enumerate(metrics):
            (jd.metrics_dir / f"launch-1-rank-{rank}.jsonl").write_bytes(data)
        ingest_job(module_store, HOSTILE, jd.path, "t")
        ingest_job(module_store, HOSTILE, jd.path, "t")
        (_, spec, _), = views.ManagedJobs(root).find(
            FakeCluster(info(HOSTILE)).observe()).values()
        facts = views.daemon_job_facts(jd, spec, info(HOSTILE), module_store, False)
        view = views.job_view(facts)
        assert view.job_id == HOSTILE
        for p in view.profile:
            assert all(math.isfinite(x) and x >= 0 for x in (p.step_time, p.throughput))
    finally:
        shutil.rmtree(root)


# -- the protocol's readers: bounded, never blocking, never following a link ------------------

READERS = {"control.json": ctl.read_control, "ack.json": ctl.read_ack,
           "progress.json": ctl.read_progress, "launcher.json": ctl.read_launcher_state}
BAD_FILES = {
    "FIFO": (fifo, "not a regular file"),
    "link to /etc/passwd": (lambda p: p.symlink_to("/etc/passwd"), "symbolic link"),
    "directory": (lambda p: p.mkdir(), "not a regular file"),
    "over 1 MiB": (lambda p: p.write_bytes(b" " * ctl.MAX_JSON_BYTES + b"{}"), "larger than"),
    "not UTF-8": (lambda p: p.write_bytes(b'{"schema": "\xff"}'), "not UTF-8"),
    "nested too deep": (lambda p: p.write_bytes(b"[" * 100_000), "too deep"),
    "an integer too long": (lambda p: p.write_bytes(b"9" * 5000), "not valid JSON"),
    "not an object": (lambda p: p.write_bytes(b"[]"), "expected a JSON object"),
}


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("make,why", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_protocol_readers_refuse_hostile_files(tmp_path, no_hang, name, make, why):
    path = tmp_path / name
    make(path)
    with pytest.raises(ctl.ProtocolError, match=why):
        READERS[name](path, "u")
    assert READERS[name](tmp_path / "missing.json", "u") is None


def progress(**kw) -> dict:
    return {"schema": ctl.PROGRESS_SCHEMA, "job_uid": "u", "generation": 0, "step": 2, "epoch": 0,
            "samples_processed": 128, "epoch_position": 128, "throughput": 10.0, "world_size": 2,
            "global_batch_size": 64, "time": 1.0, **kw}


PROGRESS_CASES = {
    "a step that is not a number": ({"step": "2"}, "step"),
    "negative samples": ({"samples_processed": -1}, "samples_processed"),
    "samples as a float": ({"samples_processed": 1.5}, "samples_processed"),
    "an integer too large to compute with": ({"total_samples": 2**70}, "total_samples"),
    "a throughput that is not a number": ({"throughput": "fast"}, "throughput"),
    "finished that is not a boolean": ({"finished": 1}, "finished"),
}


@pytest.mark.parametrize("change,field", PROGRESS_CASES.values(), ids=PROGRESS_CASES.keys())
def test_read_progress_checks_types(tmp_path, change, field):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(progress(**change)))
    with pytest.raises(ctl.ProtocolError, match=field):
        ctl.read_progress(path, "u")


def test_read_progress_reads_diverged_gradient_statistics_as_not_measured(tmp_path):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps(progress(grad_sqr=math.nan, grad_var=1e400, throughput=-3.0)))
    p = ctl.read_progress(path, "u")
    assert (p.grad_sqr, p.grad_var, p.throughput) == (None, None, -3.0)
