"""Reading a job's own records (metrics written by hpcsched.job.elastic) to verify a run.

Used by the end-to-end tests: every sample of every epoch processed exactly once, the
configuration in force per generation, the loss curve.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path


def load_records(job_dir: Path) -> list[dict]:
    recs = []
    for f in sorted((Path(job_dir) / "metrics").glob("launch-*-rank-*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                recs.append(json.loads(line))
    return recs


def epochs_trained(recs: list[dict], submitted: int) -> int:
    """The epochs a job trained: all ``submitted`` of them, or fewer for a paced job that was
    unpaced (tests/paced_digits.py ends it with the epoch in progress then). The records'
    last epoch plus one; at least one and at most ``submitted``."""
    assert recs, "the job recorded no step"
    trained = max(r["epoch"] for r in recs) + 1
    assert 1 <= trained <= submitted, f"trained {trained} epochs of {submitted}"
    return trained


def check_exactly_once(recs: list[dict], dataset_size: int, epochs: int) -> None:
    """Every sample of every epoch in exactly one step record of one rank, and no step twice."""
    per_step = Counter((r["step"], r["rank"]) for r in recs)
    dup = [k for k, n in per_step.items() if n > 1]
    assert not dup, f"steps recorded more than once (work redone): {dup[:5]}"
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for r in recs:
        assert "indices" in r, "run without --hpcsched-record-samples"
        by_epoch[r["epoch"]].extend(r["indices"])
    assert sorted(by_epoch) == list(range(epochs)), f"epochs seen: {sorted(by_epoch)}"
    for e, idx in by_epoch.items():
        c = Counter(idx)
        missing = set(range(dataset_size)) - set(c)
        twice = [i for i, n in c.items() if n > 1]
        assert not missing and not twice, (
            f"epoch {e}: {len(missing)} samples never processed, {len(twice)} processed twice")
        assert len(idx) == dataset_size


def check_positions_exactly_once(recs: list[dict], dataset_size: int, epochs: int,
                                 seed: int = 0) -> None:
    """Exactly once by data position, for runs that lost workers: every step's range of the
    epoch's permutation (``position``, ``consumed``; the same in every rank's record) tiles each
    epoch with no gap and no overlap, the steps are consecutive, and what each rank recorded
    lies in its step's range with no sample on two ranks. A lost worker's last record may be
    missing (it died after the step's reduction, before writing); the range still counts it."""
    from hpcsched.job.data import epoch_permutation

    steps: dict[int, tuple] = {}
    for r in recs:
        key = (r["epoch"], r["position"], r["consumed"])
        assert steps.setdefault(r["step"], key) == key, f"step {r['step']}: ranks disagree"
    assert sorted(steps) == list(range(len(steps))), "steps missing or repeated"
    by_epoch: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for epoch, pos, n in steps.values():
        by_epoch[epoch].append((pos, n))
    assert sorted(by_epoch) == list(range(epochs)), f"epochs seen: {sorted(by_epoch)}"
    for e, ranges in by_epoch.items():
        at = 0
        for pos, n in sorted(ranges):
            assert pos == at, f"epoch {e}: positions {at}..{pos} skipped or repeated"
            at = pos + n
        assert at == dataset_size, f"epoch {e} ends at {at}, not {dataset_size}"
    seen: dict[int, set] = defaultdict(set)
    for r in recs:
        epoch, pos, n = steps[r["step"]]
        allowed = set(epoch_permutation(dataset_size, epoch, seed)[pos:pos + n].tolist())
        idx = set(r["indices"])
        assert idx <= allowed, f"step {r['step']}: rank {r['rank']} outside its step's range"
        assert not idx & seen[r["step"]], f"step {r['step']}: a sample on two ranks"
        seen[r["step"]] |= idx


def generations(recs: list[dict]) -> dict[int, dict]:
    """Per generation: the (world size, global batch, local batch, accumulation) in force."""
    out: dict[int, set] = defaultdict(set)
    for r in recs:
        out[r["generation"]].add((r["world_size"], r["global_batch_size"], r["local_batch_size"],
                                  r["accumulation_steps"]))
    for g, s in out.items():
        assert len(s) == 1, f"generation {g} ran with several configurations: {s}"
    return {g: dict(zip(("world_size", "global_batch_size", "local_batch_size",
                         "accumulation_steps"), next(iter(s)))) for g, s in sorted(out.items())}


def mean_loss_by_step(recs: list[dict]) -> list[float]:
    """Sample-weighted mean loss per step (over ranks), in step order."""
    tot: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in recs:
        if "loss" in r and r["samples"]:
            tot[r["step"]][0] += r["loss"] * r["samples"]
            tot[r["step"]][1] += r["samples"]
    return [s / n for _, (s, n) in sorted(tot.items())]
