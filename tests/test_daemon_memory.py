"""The daemon's memory stays bounded (issue 36): what it keeps per job, by what Slurm still lists
(a daemon that runs for months sees every job ever submitted); its C heap, by what a round holds
rather than by the largest blocks it ever freed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcsched.daemon.service import trim_heap
from hpcsched.daemon.views import ManagedJobs
from hpcsched.slurm.observe import Observation
from tests.test_exclusions import _info, job_dirs

ROOT = Path(__file__).resolve().parent.parent


def _obs(*job_ids: str) -> Observation:
    return Observation(time=0.0, nodes=(), jobs={j: _info(j) for j in job_ids}, calls=0)


def test_specs_are_cached_only_while_slurm_lists_the_job(tmp_path):
    job_dirs(tmp_path, ("1", "2", "3"))
    managed = ManagedJobs(tmp_path)
    assert sorted(managed.find(_obs("1", "2", "3"))) == ["1", "2", "3"]
    assert sorted(managed._specs) == ["1", "2", "3"]
    assert sorted(managed.find(_obs("3"))) == ["3"]      # Slurm has forgotten 1 and 2 (MinJobAge)
    assert sorted(managed._specs) == ["3"]


_HEAP_PROBE = """
import re, sys
from pathlib import Path
from hpcsched.daemon.service import steady_heap
def rss():
    return int(re.search(r"^VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text(), re.M)[1]) / 1024
if sys.argv[1] == "fixed":
    assert steady_heap()
big = bytearray(8 << 20); del big          # a large block freed: glibc's dynamic threshold rises
before = rss()
blocks, kept = [], []
for _ in range(100):                        # 30 MiB in blocks over 128 KiB, each followed by a
    blocks.append(bytearray(300 << 10))     # small one that stays, as a round's results do
    kept.append(bytearray(1000))
del blocks
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_heap_gives_back_what_a_round_freed():
    """With glibc's dynamic mmap threshold, blocks freed after a larger one stay resident; with
    steady_heap's fixed threshold they go back (fresh interpreters: the allocator's state)."""
    kept = {mode: float(subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], check=True,
                                       capture_output=True, text=True, cwd=ROOT).stdout)
            for mode in ("dynamic", "fixed")}
    assert kept["dynamic"] > 8 and kept["fixed"] < 2, kept


_TRIM_PROBE = """
import re, sys
from pathlib import Path
from hpcsched.daemon.service import trim_heap
def rss():
    return int(re.search(r"^VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text(), re.M)[1]) / 1024
before = rss()
blocks = [bytearray(2000) for _ in range(20000)]   # 40 MiB of small heap blocks, as a parse makes
kept = blocks[::50]                                 # a few stay (a round's results), the rest go
del blocks
if sys.argv[1] == "trim":
    assert trim_heap()
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_round_gives_back_the_heap_pages_its_small_blocks_freed():
    """Small blocks freed between kept ones leave holes the heap keeps resident; trim_heap
    (after every round) gives their pages back (fresh interpreters)."""
    kept = {mode: float(subprocess.run([sys.executable, "-c", _TRIM_PROBE, mode], check=True,
                                       capture_output=True, text=True, cwd=ROOT).stdout)
            for mode in ("keep", "trim")}
    assert kept["keep"] > 20 and kept["trim"] < 10, kept
    assert trim_heap()
