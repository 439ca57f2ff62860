"""Metrics ingestion: aggregate (step records -> profile and per-GPU rows), read_new_lines
(complete lines after a byte offset) and ingest_job (the two against a real SQLite store)."""

from __future__ import annotations

import json
import math
import os
import random

import pytest

from hpcsched.daemon import ingest
from hpcsched.daemon.ingest import (
    MAX_LINE_BYTES,
    WARMUP_STEPS,
    Pending,
    aggregate,
    ingest_job,
    ingest_jobs,
    read_new_lines,
)
from hpcsched.daemon.record_claims import claim_problem, sequence_problems
from hpcsched.daemon.store import Store
from hpcsched.daemon.store import lists as store_lists
from hpcsched.protocol.files import ProtocolError


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


def test_ingest_jobs_reads_many_jobs_with_one_offsets_query_as_ingest_job_does_each(tmp_path, store,
                                                                                    monkeypatch):
    for j in ("8", "9"):
        store.upsert_job(job_id=j, job_uid=f"u{j}", workers_per_node=2, min_nodes=1, max_nodes=2,
                         min_batch_size=32, max_batch_size=64, base_batch_size=32)
    jobs = []
    for j, steps in (("7", 6), ("8", 5), ("9", 0)):   # job 9 has no metrics directory
        if steps:
            (tmp_path / j / "metrics").mkdir(parents=True)
            for r in two_ranks(steps, 0.1, 0.2):
                _write(tmp_path / j / "metrics" / f"launch-1-rank-{r['rank']}.jsonl", [r])
        jobs.append((j, tmp_path / j, "B"))
    queries = []
    real = store.ingest_offsets
    monkeypatch.setattr(store, "ingest_offsets", lambda paths: queries.append(list(paths)) or real(queries[-1]))
    found = Pending()
    assert ingest_jobs(store, jobs, found) == {"7": (1, 2), "8": (1, 2), "9": (0, 0)}
    assert len(queries) == 1 and len(queries[0]) == 4
    found.flush(store)
    assert [(r.world_size, r.steps) for r in store.profile("8")] == [(2, 5 - WARMUP_STEPS)]
    assert ingest_jobs(store, jobs, Pending()) == {"7": (0, 0), "8": (0, 0), "9": (0, 0)}   # nothing new
    size = (tmp_path / "8" / "metrics" / "launch-1-rank-1.jsonl").stat().st_size
    assert real([str(tmp_path / "8" / "metrics" / "launch-1-rank-1.jsonl")]) == {
        str(tmp_path / "8" / "metrics" / "launch-1-rank-1.jsonl"): size}


def test_ingest_offsets_over_more_paths_than_one_query_holds(store, monkeypatch):
    monkeypatch.setattr(store_lists, "CHUNK", 3)
    paths = {f"/j/metrics/launch-1-rank-{i}.jsonl": 100 + i for i in range(8)}
    store.set_ingest_offsets(dict(list(paths.items())[:5]), at=1.0)
    store.set_ingest_offsets({p: o + 1 for p, o in paths.items()}, at=2.0)   # 5 updated, 3 new
    assert store.ingest_offsets([*paths, "/never"]) == {**{p: o + 1 for p, o in paths.items()}, "/never": 0}


# -- bounds: untrusted files -------------------------------------------------------------------

LONG = b"x" * (MAX_LINE_BYTES + 1)
BOUND_CASES = {
    # data, offset, limit, values, new offset, skipped
    "a line over the bound skipped whole": (LONG + b'\n{"a": 1}\n', 0, None, [{"a": 1}], len(LONG) + 10, 1),
    "a line of exactly the bound is read": (b'"' + b"y" * (MAX_LINE_BYTES - 2) + b'"\n', 0, None,
                                            ["y" * (MAX_LINE_BYTES - 2)], MAX_LINE_BYTES + 1, 0),
    "a partial last line over the bound is skipped, not kept": (b'{"a": 1}\n' + LONG, 0, None, [{"a": 1}],
                                                                 9 + len(LONG), 1),
    "the rest of a skipped line is skipped next pass": (LONG + b'xx\n{"a": 1}\n', len(LONG), None,
                                                        [{"a": 1}], len(LONG) + 12, 0),
    "still inside a skipped line: all consumed": (LONG + LONG, len(LONG), None, [], 2 * len(LONG), 0),
    "invalid UTF-8 skipped": (b'\xff\n{"a": 1}\n\xc3\x28\n', 0, None, [{"a": 1}], 14, 2),
    "JSON nested too deep skipped": (b"[" * 30000 + b"]" * 30000 + b'\n{"a": 1}\n', 0, None, [{"a": 1}], 60010, 1),
    "an integer too long to convert skipped": (b"9" * 5000 + b'\n{"a": 1}\n', 0, None, [{"a": 1}], 5010, 1),
    "at most the budget read, whole lines": (b'{"a": 1}\n' * 20000, 0, 100000, [{"a": 1}] * 11111, 99999, 0),
}


@pytest.mark.parametrize("data,offset,limit,values,new_offset,skipped", BOUND_CASES.values(),
                         ids=BOUND_CASES.keys())
def test_read_new_lines_bounds(tmp_path, data, offset, limit, values, new_offset, skipped):
    f = tmp_path / "launch-1-rank-0.jsonl"
    f.write_bytes(data)
    got = read_new_lines(f, offset) if limit is None else read_new_lines(f, offset, limit)
    assert got == (values, new_offset, skipped)


def test_a_budget_below_one_line_still_reads_one_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'"' + b"y" * 1000 + b'"\n')
    assert read_new_lines(f, 0, limit=10)[1] == 1003


@pytest.mark.parametrize("make", [lambda p: os.mkfifo(p), lambda p: p.symlink_to("/etc/passwd"),
                                  lambda p: p.mkdir()], ids=["FIFO", "symbolic link", "directory"])
def test_read_new_lines_refuses_what_is_not_a_regular_file(tmp_path, make):
    make(tmp_path / "m.jsonl")
    with pytest.raises(ProtocolError):
        read_new_lines(tmp_path / "m.jsonl", 0)


def test_ingest_job_reads_the_newest_lines_within_the_budget_per_pass(tmp_path, store, monkeypatch,
                                                                     caplog):
    """Where more is unread than the budget, a pass reads the newest lines only, from a line's
    start; what it passed over is never read; a backlog within the budget is read whole."""
    monkeypatch.setattr(ingest, "FRESH_BYTES", 200_000)
    metrics = tmp_path / "job" / "metrics"
    metrics.mkdir(parents=True)
    f = metrics / "launch-1-rank-0.jsonl"
    f.write_bytes(b"\xfe" * 100 + b"\n" + b"garbage\n" * 100_000 + b"\xff" * 100 + b"\n")   # 800 kB
    assert ingest_job(store, "7", tmp_path / "job") == (0, 0)
    assert store.ingest_offset(str(f)) == f.stat().st_size
    assert caplog.text.count("not UTF-8") == 1 and "1 not UTF-8" in caplog.text   # the newest only
    assert f"skipped {1 + (200_000 - 101) // 8} line(s)" in caplog.text           # from a line's start
    caplog.clear()
    with open(f, "ab") as fh:
        fh.write(b"\xfe\n" + b"garbage\n" * 10)   # within the budget: read whole
    assert ingest_job(store, "7", tmp_path / "job") == (0, 0)
    assert "skipped 11 line(s)" in caplog.text and store.ingest_offset(str(f)) == f.stat().st_size


@pytest.mark.parametrize("data,offset,window,want", [
    (b"aaaa\nbbbb\ncccc\n", 0, 100, 0),            # all of it fits
    (b"aaaa\nbbbb\ncccc\n", 0, 6, 10),             # the last line only
    (b"aaaa\nbbbb\ncccc\n", 0, 5, 10),             # a window starting at a line's start
    (b"aaaa\nbbbb\ncccc\n", 0, 4, 10),             # no line begins in it: look back further
    (b"aaaa\nbbbb\ncccc", 0, 6, 10),                # the newest bytes, a line being written
    (b"aaaa\nbbbb\ncccc\n", 12, 2, 12),            # the offset is newer than the window
], ids=["fits", "last line", "window at a line start", "looks back", "line being written", "offset"])
def test_newest_offset(tmp_path, data, offset, window, want):
    f = tmp_path / "m.jsonl"
    f.write_bytes(data)
    assert ingest.newest_offset(f, offset, window) == want


def test_newest_offset_passes_over_a_line_longer_than_the_bound(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"a\n" + b"x" * (MAX_LINE_BYTES + 5) + b"\n")
    assert ingest.newest_offset(f, 0, 100) == f.stat().st_size
    assert ingest.newest_offset(tmp_path / "missing", 7, 100) == 7


def test_ingest_job_does_not_follow_a_linked_metrics_directory(tmp_path, store, caplog):
    other = tmp_path / "other" / "metrics"
    other.mkdir(parents=True)
    _write(other / "launch-1-rank-0.jsonl", steps(6))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "metrics").symlink_to(other)
    assert ingest_job(store, "7", tmp_path / "job") == (0, 0)
    assert "job 7" in caplog.text and "not read" in caplog.text


# -- claims ------------------------------------------------------------------------------------

NOW = 2000.0
CLAIM_CASES = {
    "an honest record": ({}, None),
    "negative step time": ({"step_time": -0.1}, "negative step_time"),
    "step time not finite": ({"step_time": math.inf}, "step_time"),
    "step time NaN": ({"step_time": math.nan}, "step_time"),
    "step time a string": ({"step_time": "0.1"}, "step_time"),
    "negative compute time": ({"compute_time": -1.0}, "negative compute_time"),
    "step not a number": ({"step": "3"}, "step"),
    "rank a boolean": ({"rank": True}, "rank"),
    "launch null": ({"launch": None}, "launch"),
    "a count too large for the store": ({"launch": 2**31}, "launch"),
    "world size not the record's own": ({"world_size": 2}, "global_batch_size 16 != world_size 2"),
    "rank outside the world": ({"rank": 1}, "rank 1"),
    "more samples than the batch": ({"global_samples": 17}, "global_samples 17"),
    "from the future": ({"t": NOW + 3600}, "future"),
    "device not an object": ({"device": [1]}, "device"),
    "device node too long for the store": ({"device": {"node": "n" * 200}}, "device field 'node'"),
}


@pytest.mark.parametrize("change,why", CLAIM_CASES.values(), ids=CLAIM_CASES.keys())
def test_claim_problem(change, why):
    problem = claim_problem({**rec(3), **change}, now=NOW)
    assert (problem is None) if why is None else (why in problem)


def seq(*pairs, step_time=0.1, **kw):
    """Records of steps (step, t)."""
    return [rec(s, t=t, step_time=step_time, **kw) for s, t in pairs]


SEQUENCE_CASES = {
    "steps in order": (seq((0, 1.0), (1, 1.11), (2, 1.22)), []),
    "a step number going backwards": (seq((0, 1.0), (1, 1.11), (1, 1.3), (2, 1.4)), [2]),
    "time going backwards": (seq((0, 1.0), (1, 1.11), (2, 0.5)), [2]),
    "another launch starts over": (seq((5, 1.0), (6, 1.11)) + seq((0, 2.0), (1, 2.11), launch=2), []),
    "steps 100 times faster than the clock": (seq((0, 1.0), (1, 2.0), (2, 3.0), step_time=0.01), [0, 1, 2]),
    "skipped step numbers do not hide it": (seq((0, 1.0), (2, 3.0), (4, 5.0), step_time=0.01), [0, 1, 2]),
    "a rare long pause does not count": (seq((0, 1.0), (1, 1.11), (2, 61.0), (3, 61.11), (4, 61.22)), []),
    "too few steps to tell": (seq((0, 1.0), (1, 2.0), step_time=0.001), []),
}


@pytest.mark.parametrize("records,bad", SEQUENCE_CASES.values(), ids=SEQUENCE_CASES.keys())
def test_sequence_problems(records, bad):
    assert [i for i, _ in sequence_problems(records)] == bad


def test_ingest_job_rejects_and_logs_impossible_records_and_keeps_the_rest(tmp_path, store, caplog):
    metrics = tmp_path / "job" / "metrics"
    metrics.mkdir(parents=True)
    honest = [rec(s, t=1000.0 + 0.11 * s) for s in range(5)]
    _write(metrics / "launch-1-rank-0.jsonl", honest[:3] + [rec(9, step_time=-1.0), rec(9, world_size=3)]
           + honest[3:])
    assert ingest_job(store, "7", tmp_path / "job") == (1, 0)
    (row,) = store.profile("7")
    assert row.steps == 5 - WARMUP_STEPS
    assert "job 7" in caplog.text and "rejected 2 impossible record(s)" in caplog.text


def test_a_pass_soon_after_the_last_reads_in_proportion_to_the_time_since():
    full, period = ingest.FRESH_BYTES, 60.0
    assert ingest.fresh_budget(None, period) == full                # first pass
    assert ingest.fresh_budget(period, period) == full              # a round interval on
    assert ingest.fresh_budget(10 * period, period) == full         # never more than the window
    assert ingest.fresh_budget(period / 4, period) == full // 4     # a round at an event
    assert ingest.fresh_budget(0.0, period) == ingest.MIN_FILE_WINDOW   # at least a file's least
    assert ingest.fresh_budget(-5.0, period) == ingest.MIN_FILE_WINDOW  # a clock step back


def test_ingest_jobs_reads_each_job_within_its_budget(tmp_path, store):
    """A job given a smaller budget reads fewer of its newest lines (its mean step time is
    over its last steps only); one the budgets do not name reads the full window. Both count
    every step they ran, read or passed over."""
    store.upsert_job(job_id="8", job_uid="u8", workers_per_node=1, min_nodes=1, max_nodes=1,
                     min_batch_size=16, max_batch_size=16, base_batch_size=16)
    jobs = []
    for j in ("7", "8"):
        (tmp_path / j / "metrics").mkdir(parents=True)
        _write(tmp_path / j / "metrics" / "launch-1-rank-0.jsonl",
               [rec(s, step_time=0.2 if s < 190 else 0.1) for s in range(200)])
        jobs.append((j, tmp_path / j, "B"))
    found = Pending()
    ingest_jobs(store, jobs, found, {"7": ingest.MIN_FILE_WINDOW})
    found.flush(store)
    line = len(json.dumps(rec(100)).encode()) + 1
    assert 10 * line > ingest.MIN_FILE_WINDOW and 40 * line < ingest.FRESH_BYTES
    (seven,), (eight,) = store.profile("7"), store.profile("8")
    assert seven.step_time == pytest.approx(0.1)          # its last 10 steps' only
    assert eight.step_time > 0.15                          # the full window's: older ones too
    for row in (seven, eight):                             # the first read's warm-up aside
        assert abs(row.steps - (200 - WARMUP_STEPS)) <= 2


def test_the_steps_a_pass_passes_over_count_in_the_jobs_attained_service(tmp_path, store):
    """Passes of the least budget over a job that writes far more between them: its profile's
    steps (its attained service) are those it ran, not those read; its other ranks' lines
    passed over count nowhere (a step is counted once, by rank 0)."""
    metrics = tmp_path / "7" / "metrics"
    metrics.mkdir(parents=True)
    written = 0
    for _ in range(3):
        recs = two_ranks(written + 150, 0.1, 0.1)[2 * written:]
        for rank in (0, 1):
            _write(metrics / f"launch-1-rank-{rank}.jsonl", [r for r in recs if r["rank"] == rank])
        written += 150
        found = Pending()
        ingest_jobs(store, [("7", tmp_path / "7", "B")], found, {"7": ingest.MIN_FILE_WINDOW})
        found.flush(store)
    (row,) = store.profile("7")
    assert row.samples == 3
    assert abs(row.steps - (written - 3 * WARMUP_STEPS)) <= 3


@pytest.mark.parametrize("passed, read, lines, want", [
    (1000, 500, 5, 10),     # lines of 100 bytes
    (1050, 500, 5, 10),     # a line's few digits more or less
    (0, 500, 5, 0),         # nothing passed over
    (1000, 0, 0, 0),        # nothing read to go by
    (-10, 500, 5, 0),
])
def test_passed_over_lines(passed, read, lines, want):
    assert ingest.passed_over_lines(passed, read, lines) == want


def test_budgets_follow_the_time_since_each_jobs_last_pass():
    clock = [100.0]
    b = ingest.Budgets(60.0, clock=lambda: clock[0])
    full = ingest.FRESH_BYTES
    assert b.take(["7", "8"]) == {"7": full, "8": full}   # not read yet
    clock[0] += 15.0
    assert b.take(["7"]) == {"7": full // 4}
    clock[0] += 15.0   # job 8 last read 30 s ago; job 7 ended: its last pass reads it all
    assert b.take(["7", "8"], ended={"7"}) == {"7": full, "8": full // 2}
    b.keep({"8"})
    assert "7" not in b and "8" in b
    assert b.take(["7"]) == {"7": full}   # forgotten: read as new
