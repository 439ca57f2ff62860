"""benchmarks/chaos.py's judgement of a job's records: one history where a later launch's record
of a step replaces an earlier one (work redone), every sample exactly once in it, and the
seconds each restart redid."""

from __future__ import annotations

import pytest

from hpcsched.job.data import epoch_permutation
from tests.bench_scripts import load

chaos = load("chaos")

SIZE, SEED, BATCH = 12, 7, 4   # 3 steps per epoch on 2 ranks


def _step(step: int, launch: int, t: float, ranks: int = 2) -> list[dict]:
    epoch, pos = divmod(step * BATCH, SIZE)
    perm = epoch_permutation(SIZE, epoch, SEED)[pos:pos + BATCH].tolist()
    per = BATCH // ranks
    return [{"step": step, "launch": launch, "epoch": epoch, "position": pos, "consumed": BATCH,
             "rank": r, "indices": perm[r * per:(r + 1) * per], "t": t, "step_time": 2.0}
            for r in range(ranks)]


def _run(steps_by_launch: list[range]) -> list[dict]:
    recs, t = [], 1000.0
    for launch, steps in enumerate(steps_by_launch):
        for s in steps:
            t += 2.0
            recs += _step(s, launch, t)
    return recs


def test_a_clean_run_is_exactly_once_and_redoes_nothing():
    kept, redone = chaos.history(_run([range(8)]))
    assert chaos.exactly_once(kept, SEED, SIZE) is None
    assert redone == [] and chaos.restarts_lost(redone, kept) == []


def test_a_restart_from_a_checkpoint_redoes_the_steps_after_it():
    recs = _run([range(6), range(4, 9)])   # checkpoint after step 3; steps 4 and 5 again
    kept, redone = chaos.history(recs)
    assert chaos.exactly_once(kept, SEED, SIZE) is None
    lost = chaos.restarts_lost(redone, kept)
    assert len(lost) == 1 and lost[0][1] == pytest.approx(4.0)   # two steps of 2 s


@pytest.mark.parametrize("damage, want", [
    (lambda recs: [r for r in recs if r["step"] != 3], "steps missing"),
    (lambda recs: [dict(r, indices=[0, 1]) if r["step"] == 2 and r["rank"] == 1 else r for r in recs],
     "outside its range"),
    (lambda recs: [dict(r, position=r["position"] + 1) if r["step"] == 4 else r for r in recs],
     "skipped or repeated"),
    (lambda recs: [dict(r, consumed=2) if r["step"] == 5 else r for r in recs],   # epoch 1 short
     "do not end at 12"),
])
def test_lost_or_doubled_samples_are_named(damage, want):
    kept, _ = chaos.history(damage(_run([range(10)])))
    assert want in (chaos.exactly_once(kept, SEED, SIZE) or "")


def test_garbage_lines_are_counted_not_read(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    import json

    lines = [json.dumps(r) for r in _step(0, 0, 1.0)]
    (metrics / "launch-0-rank-0.jsonl").write_bytes(
        ("\n".join(lines) + '\n{"t": 17, "step": \n').encode() + b"\x00\xff not json\n")
    recs, junk = chaos.read_records(tmp_path)
    assert len(recs) == 2 and junk == 2


def test_a_restart_is_given_to_the_latest_fault_that_hit_the_job_else_the_clusters():
    F = chaos.Fault
    faults = [F("node-drain", 10.0), F("worker-kill", 20.0, job="5"), F("daemon-kill", 30.0),
              F("metrics-garbage", 35.0, job="5")]
    assert chaos.attribute("5", 1040.0, faults, 1000.0).kind == "worker-kill"
    assert chaos.attribute("6", 1040.0, faults, 1000.0).kind == "daemon-kill"
    assert chaos.attribute("6", 1015.0, faults, 1000.0).kind == "node-drain"
    assert chaos.attribute("6", 1005.0, faults, 1000.0) is None
