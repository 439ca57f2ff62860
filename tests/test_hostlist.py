"""Tests for ``hpcsched.slurm.hostlist``: hostlist expressions expanded without Slurm."""

from __future__ import annotations

import pytest

from hpcsched.slurm import SlurmError, expand_hostlist
from hpcsched.slurm.hostlist import split_top


@pytest.mark.parametrize("expr, want", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1-2,4],m7", ["n1", "n2", "n4", "m7"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("", []),
])
def test_expand_hostlist(expr, want):
    assert expand_hostlist(expr) == want


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_bad(bad):
    with pytest.raises(SlurmError):
        expand_hostlist(bad)


@pytest.mark.parametrize("text, want", [
    ("gpu:2(IDX:0,2),mps:1", ["gpu:2(IDX:0,2)", "mps:1"]),
    ("n[1,3],m1", ["n[1,3]", "m1"]),
    (" a , ,b ", ["a", "b"]),
    ("", []),
])
def test_split_top(text, want):
    assert split_top(text) == want
