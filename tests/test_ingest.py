"""Metrics ingestion: aggregate (step records -> profile and per-GPU rows), read_new_lines
(complete lines after a byte offset) and ingest_job (the two against a real SQLite store)."""

from __future__ import annotations

import json
import random

import pytest

from hpcsched.daemon.ingest import WARMUP_STEPS, aggregate, ingest_job, read_new_lines
from hpcsched.daemon.store import Store


def rec(step, rank=0, *, world=1, step_time=0.1, compute=None, node="n1", **kw):
    """One step record as hpcsched.job.elastic writes it (the fields aggregate reads)."""
    r = {"t": 1000.0 + step, "launch": 1, "restart": 0, "generation": 0, "step": step,
         "epoch": 0, "rank": rank, "world_size": world, "nodes": 1, "local_batch_size": 16,
         "accumulation_steps": 1, "global_batch_size": 16 * world, "global_samples": 16 * world,
         "samples": 16, "step_time": step_time, "compute_time": compute,
         "device": {"node": node, "local_rank": rank, "gpu_index": str(rank), "gpu_uuid": f"GPU-{node}-{rank}"}}
    r.update(kw)
    return r


def profile_row(**kw):
    """A profile row of job 7 with the defaults of ``rec``."""
    return {"job_id": "7", "launch": 1, "generation": 0, "world_size": 1, "nodes": 1,
            "local_batch_size": 16, "accumulation_steps": 1, "global_batch_size": 16, **kw}


def steps(n, **kw):
    return [rec(s, **kw) for s in range(n)]


def two_ranks(n, compute0, compute1, **kw):
    """``n`` steps of a 2-GPU job on one node, rank 1's compute time ``compute1``."""
    return [rec(s, r, world=2, compute=c, **kw)
            for s in range(n) for r, c in ((0, compute0), (1, compute1))]


PROFILE_CASES = {
    "warm-up dropped, mean over the rest": (
        steps(5), [profile_row(time=1004.0, step_time=0.1, throughput=160.0, steps=3)]),
    "only warm-up steps: no row": (steps(WARMUP_STEPS), []),
    "zero step times dropped after the warm-up": (
        steps(3) + [rec(3, step_time=0.0), rec(4, step_time=0.3)],
        [profile_row(time=1004.0, step_time=0.2, throughput=80.0, steps=2)]),
    "one row per generation, warm-up in each": (
        steps(4) + [rec(s, generation=1, local_batch_size=32, global_batch_size=32,
                        global_samples=32, step_time=0.2) for s in range(4, 8)],
        [profile_row(time=1003.0, step_time=0.1, throughput=160.0, steps=2),
         profile_row(time=1007.0, generation=1, local_batch_size=32, global_batch_size=32,
                     step_time=0.2, throughput=160.0, steps=2)]),
    "samples from global_batch_size when global_samples is missing": (
        [{k: v for k, v in r.items() if k != "global_samples"} for r in steps(3)],
        [profile_row(time=1002.0, step_time=0.1, throughput=160.0, steps=1)]),
    "only rank 0 counts": (
        two_ranks(3, 0.05, 0.05, step_time=0.5),
        [profile_row(time=1002.0, world_size=2, global_batch_size=32, step_time=0.5,
                     throughput=64.0, steps=1)]),
    "records without step or rank, and non-dicts, are ignored": (
        steps(3) + [{"rank": 0, "step_time": 9.0}, {"step": 9, "step_time": 9.0}, [1], "x", None],
        [profile_row(time=1002.0, step_time=0.1, throughput=160.0, steps=1)]),
}


@pytest.mark.parametrize("records,expected", PROFILE_CASES.values(), ids=PROFILE_CASES.keys())
def test_aggregate_profile(records, expected):
    profile, _ = aggregate(records, "7")
    assert profile == [pytest.approx(e) for e in expected]


def gpu_row(rank, speed, n, node="n1", t=None):
    return {"job_id": "7", "time": t if t is not None else 1000.0 + n - 1, "node": node,
            "local_rank": rank, "gpu_index": str(rank), "gpu_uuid": f"GPU-{node}-{rank}",
            "app_class": "B", "relative_speed": speed, "steps": n}


GPU_CASES = {
    "one GPU: nothing to compare": (steps(4, compute=0.1), []),
    "two ranks: median over rank": (
        two_ranks(4, 0.1, 0.2), [gpu_row(0, 1.5, 4), gpu_row(1, 0.75, 4)]),
    "a step missing a rank is left out": (
        two_ranks(3, 0.1, 0.3) + [rec(3, 0, world=2, compute=0.1)],
        [gpu_row(0, 2.0, 3), gpu_row(1, 2 / 3, 3)]),
    "records without a compute time are left out": (
        two_ranks(2, 0.1, 0.1) + two_ranks(1, None, None)[:1],
        [gpu_row(0, 1.0, 2), gpu_row(1, 1.0, 2)]),
    "the same step number in two launches: two steps": (
        two_ranks(1, 0.1, 0.2) + two_ranks(1, 0.2, 0.2, launch=2),
        [gpu_row(0, (1.5 + 1.0) / 2, 2, t=1000.0), gpu_row(1, (0.75 + 1.0) / 2, 2, t=1000.0)]),
    "four ranks on two nodes: one row per device": (
        [rec(s, r, world=4, compute=c, node=node, device={"node": node, "local_rank": r % 2,
                                                          "gpu_index": str(r % 2),
                                                          "gpu_uuid": f"GPU-{node}-{r % 2}"})
         for s in range(2) for r, c, node in ((0, 0.1, "n1"), (1, 0.1, "n1"), (2, 0.2, "n2"),
                                              (3, 0.4, "n2"))],
        [gpu_row(0, 1.5, 2), gpu_row(1, 1.5, 2), gpu_row(0, 0.75, 2, node="n2"),
         gpu_row(1, 0.375, 2, node="n2")]),
    "no device: node '?', the rank as local rank": (
        [{**r, "device": None} for r in two_ranks(1, 0.1, 0.1)],
        [{**gpu_row(r, 1.0, 1), "node": "?", "gpu_index": None, "gpu_uuid": None} for r in (0, 1)]),
}


@pytest.mark.parametrize("records,expected", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_aggregate_gpus(records, expected):
    _, gpus = aggregate(records, "7", app_class="B")
    key = lambda g: (g["node"], g["local_rank"])  # noqa: E731
    assert sorted(gpus, key=key) == [pytest.approx(e) for e in sorted(expected, key=key)]


def test_aggregate_does_not_depend_on_record_order():
    records = steps(6) + two_ranks(5, 0.1, 0.2, launch=2, generation=1)
    shuffled = list(records)
    random.Random(3).shuffle(shuffled)
    (p1, g1), (p2, g2) = aggregate(records, "7"), aggregate(shuffled, "7")
    assert len(p1) == 2 and len(g1) == 2
    assert p2 == p1 and sorted(g2, key=str) == [pytest.approx(g) for g in sorted(g1, key=str)]


# -- read_new_lines ----------------------------------------------------------------------------

LINE_CASES = {
    "complete lines": (b'{"a": 1}\n{"b": 2}\n', 0, [{"a": 1}, {"b": 2}], 18, 0),
    "partial last line left for later": (b'{"a": 1}\n{"b": ', 0, [{"a": 1}], 9, 0),
    "no complete line": (b'{"a": 1', 0, [], 0, 0),
    "empty file": (b"", 0, [], 0, 0),
    "from the offset on": (b'{"a": 1}\n{"b": 2}\n', 9, [{"b": 2}], 18, 0),
    "at the end": (b'{"a": 1}\n', 9, [], 9, 0),
    "bad JSON line counted and passed": (b'{"a": 1}\nnot json\n{"c": 3}\n', 0, [{"a": 1}, {"c": 3}], 27, 1),
    "blank lines skipped": (b'\n  \n{"a": 1}\n', 0, [{"a": 1}], 13, 0),
    "a line cut by a crash, then complete ones": (b'{"a": \n{"b": 2}\n', 0, [{"b": 2}], 16, 1),
}


@pytest.mark.parametrize("data,offset,records,new_offset,bad", LINE_CASES.values(), ids=LINE_CASES.keys())
def test_read_new_lines(tmp_path, data, offset, records, new_offset, bad):
    f = tmp_path / "launch-1-rank-0.jsonl"
    f.write_bytes(data)
    assert read_new_lines(f, offset) == (records, new_offset, bad)


def test_read_new_lines_of_a_missing_file(tmp_path):
    assert read_new_lines(tmp_path / "none.jsonl", 5) == ([], 5, 0)


def test_a_line_being_written_is_read_once_complete(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'{"step": 0}\n{"step"')
    first, off, _ = read_new_lines(f, 0)
    with open(f, "ab") as fh:
        fh.write(b': 1}\n')
    second, off2, _ = read_new_lines(f, off)
    assert (first, second, off2) == ([{"step": 0}], [{"step": 1}], f.stat().st_size)


# -- ingest_job --------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'h.db'}")
    s.upgrade()
    s.upsert_job(job_id="7", job_uid="u7", user="a", script="t.py", workers_per_node=2,
                 min_nodes=1, max_nodes=2, min_batch_size=32, max_batch_size=64,
                 base_batch_size=32, lr_scaling="linear", spec_json="{}", state="RUNNING",
                 last_seen=1.0)
    yield s
    s.close()


def _write(path, records, tail=b""):
    with open(path, "ab") as fh:
        fh.write(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)


def test_ingest_job_reads_each_line_once(tmp_path, store):
    metrics = tmp_path / "job" / "metrics"
    metrics.mkdir(parents=True)
    recs = two_ranks(6, 0.1, 0.2)
    for rank in (0, 1):
        _write(metrics / f"launch-1-rank-{rank}.jsonl", [r for r in recs if r["rank"] == rank],
               tail=b'{"step": 6, "ra')  # a line being written
    assert ingest_job(store, "7", tmp_path / "job", "B") == (1, 2)
    assert ingest_job(store, "7", tmp_path / "job", "B") == (0, 0)  # nothing new
    (row,) = store.profile("7")
    assert (row.world_size, row.steps) == (2, 6 - WARMUP_STEPS)
    size = (metrics / "launch-1-rank-0.jsonl").stat().st_size
    assert store.ingest_offset(str(metrics / "launch-1-rank-0.jsonl")) == size - len(b'{"step": 6, "ra')
