"""benchmarks/store_statements.py run small: both ways, each in its own process, and the padded
way runs far fewer ``IN`` texts than the plain one."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bench_scripts import BENCH


def test_both_ways_run_and_padding_bounds_the_texts(tmp_path):
    out = tmp_path / "s.json"
    subprocess.run([sys.executable, str(BENCH / "store_statements.py"), "--jobs", "40",
                    "--rounds", "12", "--out", str(out)], check=True, capture_output=True)
    by = {r["padded"]: r for r in json.loads(out.read_text())["results"]}
    # 30-40 ids: padded to 32 or 64, two texts for each of the four queries; one per length
    assert by[True]["in_texts"] <= 2 * 4 < by[False]["in_texts"]
    assert all(r["rss_end_mib"] > 0 for r in by.values())
