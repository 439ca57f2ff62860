"""ElasticDataLoader: torch's DataLoader fed from the job's exact data position (one process;
the multi-process cases are in tests/test_loader_gloo.py)."""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from hpcsched.elastic import ElasticDataLoader, ElasticJob
from hpcsched.protocol.jobdir import JobDir
from tests.gloo_workers import worker_env, write_control

N = 103


class Indexed(Dataset):
    """Sample i is (i as a tensor, a feature vector)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor(i), torch.full((3,), float(i))


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for k in list(os.environ):
        if k.startswith("HPCSCHED_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HPCSCHED_GRAD_NOISE", "0")
    return monkeypatch


def _train(job, loader, on_step=None):
    seen = []
    for step in job.steps():
        got = [b[0].tolist() for b in loader.micro_batches(step)]
        assert got == [m for m in step.micro_batches if m]
        seen.append((step.epoch, [i for mb in got for i in mb]))
        if on_step:
            on_step(step)
    return seen


def _exactly_once(seen, epochs):
    for e in range(epochs):
        c = Counter(i for ep, idx in seen if ep == e for i in idx)
        assert sorted(c) == list(range(N)) and set(c.values()) == {1}


@pytest.mark.parametrize("loader_args", [
    dict(num_workers=0),
    dict(num_workers=2, persistent_workers=True, prefetch_factor=3),
    dict(num_workers=2, persistent_workers=False, pin_memory=False),
])
def test_each_step_gets_exactly_its_indices(clean_env, loader_args):
    job = ElasticJob(dataset_size=N, epochs=3, batch_size=16, seed=4)
    loader = ElasticDataLoader(job, Indexed(), **loader_args)
    seen = _train(job, loader)
    _exactly_once(seen, 3)
    assert loader.restarts == 1  # predicted across steps and epochs: never restarted
    job.close()


@pytest.mark.parametrize("persistent", [True, False])
def test_a_batch_change_drops_prefetched_batches_and_keeps_workers(clean_env, tmp_path, persistent):
    """A 'continue' generation mid-run changes the batch split in place: the batches the
    workers prefetched for the old split are never handed out; persistent workers survive."""
    jd = JobDir.create(tmp_path)
    for k, v in worker_env(jd, 0, 1, 0, 0, 8, 1, 1).items():
        if k.startswith("HPCSCHED_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            clean_env.setenv(k, v)
    clean_env.setenv("HPCSCHED_GRAD_NOISE", "0")
    job = ElasticJob(dataset_size=N, epochs=3, batch_size=8, seed=1, boundary_interval=0)
    loader = ElasticDataLoader(job, Indexed(), num_workers=2, persistent_workers=persistent)
    workers = []

    def on_step(step):
        if step.step == 0:
            workers.append(loader._it._workers)
        if step.step == 5:
            write_control(jd, 1, "continue", world=1, local=5, accum=3)
        if step.step == 20:
            write_control(jd, 2, "continue", world=1, local=32, accum=1)

    seen = _train(job, loader, on_step)
    _exactly_once(seen, 3)
    assert loader.restarts == 3          # the first start and one per new configuration
    assert (loader._it._workers is workers[0]) == persistent
    assert all(w.is_alive() for w in loader._it._workers)
    job.close()


def test_iterable_datasets_and_batching_arguments_are_refused(clean_env):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(N))

    job = ElasticJob(dataset_size=N, epochs=1, batch_size=8)
    with pytest.raises(TypeError, match="map-style"):
        ElasticDataLoader(job, Stream())
    with pytest.raises(TypeError, match="batch_size"):
        ElasticDataLoader(job, Indexed(), batch_size=4)
    with pytest.raises(ValueError, match="samples"):
        ElasticDataLoader(job, torch.utils.data.TensorDataset(torch.zeros(5)))
    job.close()


def test_rank_with_no_sample_gets_one_padding_micro_batch():
    from hpcsched.job.loader import rank_lists

    assert rank_lists([[3, 4], []]) == ([[3, 4]], False)
    assert rank_lists([[], []]) == ([[0]], True)
    assert np.array_equal(rank_lists([[1], [2]])[0], [[1], [2]])
