"""benchmarks/daemon_scale.py's pure parts: what its --tracemalloc diagnosis reports."""

from __future__ import annotations

import tracemalloc

from tests.bench_scripts import load


def _hold(n: int) -> list[bytes]:
    return [bytes(1024) for _ in range(n)]


def test_the_places_that_grew_most_are_reported_first_with_their_callers():
    bench = load("daemon_scale")
    tracemalloc.start(5)
    try:
        big = _hold(2000)      # about 2 MiB kept
        small = _hold(100)     # and 100 KiB, from another line
        growth = bench.traced_growth(tracemalloc.take_snapshot(), 2)
    finally:
        tracemalloc.stop()
    assert len(growth) == 2 and growth[0]["kib"] >= 1900 and growth[0]["blocks"] >= 2000
    here = "tests/test_daemon_scale_script.py:"
    assert all(w.startswith(here) for w in growth[0]["where"][-3:])   # _hold, and this test
    assert growth[1]["where"][-1] == growth[0]["where"][-1]        # the same allocation line,
    assert growth[1]["where"] != growth[0]["where"]                # called from another line
    assert 90 <= growth[1]["kib"] < 200
    assert len(big) + len(small) == 2100
