"""Batch-size arithmetic and the exact-position data cut (pure logic)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.job.elastic import epoch_permutation, rank_micro_batches
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch, lr_scale, split_global_batch


def test_lr_scaling_rules():
    assert lr_scale("linear", 256, 128) == 2.0
    assert lr_scale("sqrt", 512, 128) == 2.0
    assert lr_scale("none", 512, 128) == 1.0
    with pytest.raises(ValueError, match="unknown learning-rate scaling rule"):
        lr_scale("cubic", 1, 1)


def test_split_uses_accumulation_above_per_gpu_limit():
    cfg = split_global_batch(256, 4, max_local_batch_size=32)
    assert (cfg.local_batch_size, cfg.accumulation_steps) == (32, 2)
    assert cfg.global_batch_size == 256
    assert split_global_batch(256, 4).accumulation_steps == 1


def test_split_refuses_fewer_samples_than_workers():
    with pytest.raises(BatchSizeError, match="smaller than the world size"):
        split_global_batch(3, 4)


def test_fit_batch_respects_limits():
    cfg = fit_batch(1000, 4, min_global=16, max_global=128)
    assert cfg.global_batch_size == 128
    assert fit_batch(100, 3, min_global=99, max_global=101).global_batch_size == 99
    assert fit_batch(100, 4, max_local_batch_size=7).local_batch_size <= 7
    with pytest.raises(BatchSizeError, match="no global batch size fits"):
        fit_batch(64, 16, max_global=8)


@given(b=st.integers(1, 5000), w=st.integers(1, 64), m=st.one_of(st.none(), st.integers(1, 512)),
       lo=st.integers(1, 300), span=st.integers(0, 5000))
@settings(max_examples=300, deadline=None)
def test_fit_batch_property(b, w, m, lo, span):
    hi = lo + span
    try:
        cfg = fit_batch(b, w, min_global=lo, max_global=hi, max_local_batch_size=m)
    except BatchSizeError:
        # only allowed when no multiple of the world size lies within the limits
        assert hi // w < max(1, -(-lo // w))
        return
    assert cfg.world_size == w
    assert max(lo, w) <= cfg.global_batch_size <= hi
    if m is not None:
        assert cfg.local_batch_size <= m


configs = st.builds(
    BatchConfig,
    world_size=st.integers(1, 8),
    local_batch_size=st.integers(1, 40),
    accumulation_steps=st.integers(1, 3),
)


@given(n=st.integers(1, 400), seed=st.integers(0, 2**16), plan=st.lists(configs, min_size=1, max_size=30))
@settings(max_examples=200, deadline=None)
def test_every_sample_exactly_once_whatever_the_resizes(n, seed, plan):
    """Changing world size / batch size at any step boundary never skips or repeats a sample."""
    perm = epoch_permutation(n, 0, seed)
    seen = []
    position, i = 0, 0
    while position < n:
        cfg = plan[i % len(plan)]
        i += 1
        total = 0
        for r in range(cfg.world_size):
            micro, global_samples, consumed = rank_micro_batches(perm, position, cfg, r)
            assert len(micro) <= cfg.accumulation_steps
            assert all(len(m) <= cfg.local_batch_size for m in micro)
            seen.extend(i for m in micro for i in m)
            total += sum(len(m) for m in micro)
        assert total == global_samples == consumed == min(cfg.global_batch_size, n - position)
        position += consumed
    assert sorted(seen) == list(range(n))


def test_short_last_batch_is_spread_evenly():
    perm = np.arange(10)
    cfg = BatchConfig(4, 4, 1)
    sizes = [len(rank_micro_batches(perm, 4, cfg, r)[0][0]) for r in range(4)]
    assert sorted(sizes) == [1, 1, 2, 2]


def test_permutation_is_seeded_per_epoch():
    a, b = epoch_permutation(100, 0, 7), epoch_permutation(100, 1, 7)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, epoch_permutation(100, 0, 7))
    assert math.isclose(sorted(a)[-1], 99)
