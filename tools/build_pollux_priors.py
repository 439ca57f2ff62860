#!/usr/bin/env python3
"""Rebuild the shipped Pollux profiles and priors from the Pollux artifact's traces (tooling).

    .venv/bin/python tools/build_pollux_priors.py TRACE_ROOT [OUT_DIR]

``TRACE_ROOT`` holds ``<app>/placements.csv`` and ``<app>/scalability.csv`` for every application
of :data:`hpcsched.perf.priors.APPLICATIONS` (e.g. ``../shared/data/pollux/traces``); ``OUT_DIR``
defaults to ``hpcsched/data/pollux``. Writes ``profiles.csv`` (the traces averaged per
``(num_nodes, num_replicas, local_bsz)``) and ``priors.json`` (the
:class:`~hpcsched.perf.pollux.PerfParams` fitted per application by
:func:`~hpcsched.perf.pollux.fit_perf_params`, with the fit's error), deterministically; see
``hpcsched/data/pollux/SOURCE.md``. Nothing in the package calls this: the scheduler only reads
``priors.json`` (:mod:`hpcsched.perf.priors`).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hpcsched.perf import priors  # noqa: E402
from hpcsched.perf.pollux import PerfParams, PerfSample, fit_perf_params, step_time  # noqa: E402

PROFILES_FILE = priors.DATA_DIR / "profiles.csv"


def read_pollux_traces(trace_root: Path | str, app: str) -> list[dict[str, float]]:
    """Rows of ``<trace_root>/<app>/placements.csv`` and ``scalability.csv`` averaged per
    ``(num_nodes, num_replicas, local_bsz)`` (a placement "13" = 1 GPU on one node and 3 on
    another: 2 nodes, 4 replicas, as Pollux's simulator reads it)."""
    root = Path(trace_root) / app
    acc: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    with open(root / "placements.csv", newline="") as f:
        for r in csv.DictReader(f):
            p = r["placement"].strip()
            key = (len(p), sum(int(c) for c in p), int(r["local_bsz"]))
            acc.setdefault(key, []).append((float(r["step_time"]), float(r["sync_time"])))
    with open(root / "scalability.csv", newline="") as f:
        for r in csv.DictReader(f):
            key = (int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"]))
            acc.setdefault(key, []).append((float(r["step_time"]), float(r["sync_time"])))
    return [{"application": app, "num_nodes": key[0], "num_replicas": key[1], "local_bsz": key[2],
             "step_time": float(f"{np.mean([s for s, _ in v]):.6g}"),
             "sync_time": float(f"{np.mean([y for _, y in v]):.6g}"), "count": len(v)}
            for key, v in sorted(acc.items())]


def samples_from_rows(rows: Sequence[dict]) -> list[PerfSample]:
    """Profile rows (as in ``profiles.csv``) as fit inputs: the step time is the optimizer step,
    ``step_time - sync_time`` the compute of one micro-batch (Pollux simulator,
    ``applications.py``)."""
    out = []
    for r in rows:
        step, sync = float(r["step_time"]), float(r["sync_time"])
        comp = step - sync
        out.append(PerfSample(int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"]), 1,
                              step, comp if comp > 0 else None))
    return out


def read_shipped_profiles(path: Path | str = PROFILES_FILE) -> dict[str, list[dict]]:
    """The shipped ``profiles.csv``, rows per application."""
    out: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out.setdefault(r["application"], []).append(r)
    return out


def fit_report(params: PerfParams, samples: Sequence[PerfSample]) -> dict[str, float]:
    """How well ``params`` predicts ``samples``' step times: RMS log error, median and largest
    relative error."""
    pred = np.array([step_time(params, s.nodes, s.replicas, s.local_bsz, s.accum)
                     for s in samples])
    meas = np.array([s.step_time for s in samples])
    rel = np.abs(pred / meas - 1.0)
    return {"rmsle_step_time": float(np.sqrt(np.mean(np.log(pred / meas) ** 2))),
            "median_abs_rel_error": float(np.median(rel)), "max_abs_rel_error": float(rel.max())}


def build_priors(trace_root: Path | str, out_dir: Path | str = priors.DATA_DIR) -> dict:
    """Rebuild ``profiles.csv`` and ``priors.json`` in ``out_dir`` from the Pollux traces.
    Returns the priors document."""
    out_dir = Path(out_dir)
    rows: list[dict] = []
    for app in priors.APPLICATIONS:
        rows.extend(read_pollux_traces(trace_root, app))
    cols = ["application", "num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time",
            "count"]
    with open(out_dir / "profiles.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    apps = {}
    for app in priors.APPLICATIONS:
        samples = samples_from_rows([r for r in rows if r["application"] == app])
        p = fit_perf_params(samples)
        apps[app] = {"params": {k: float(f"{v:.6g}") for k, v in p.as_dict().items()},
                     "configurations": len(samples),
                     "local_bsz": [min(s.local_bsz for s in samples),
                                   max(s.local_bsz for s in samples)],
                     "max_replicas": max(s.replicas for s in samples),
                     **{k: round(v, 4) for k, v in fit_report(p, samples).items()}}
    doc = {"model": "T_step = (s-1)*T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma); "
                    "see hpcsched/perf/pollux.py",
           "units": "seconds (AWS g4dn.12xlarge, NVIDIA T4, 4 GPUs per node)",
           "source": "github.com/petuum/adaptdl, branch osdi21-artifact, commit "
                     "c793c7089bd307462686339d29707925c461f9a9, simulator/traces/<app>/"
                     "{placements,scalability}.csv (Apache-2.0); see SOURCE.md",
           "applications": apps}
    (out_dir / "priors.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    priors.clear_cache()
    return doc


def main(argv: Sequence[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = argv[1] if len(argv) == 2 else priors.DATA_DIR
    print(json.dumps(build_priors(argv[0], out)["applications"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
