"""ElasticDDP in one process (no process group: no DDP, the job's single-rank estimators)."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from hpcsched.elastic import ElasticDataLoader, ElasticDDP, ElasticJob


@pytest.fixture
def job(monkeypatch):
    for k in list(os.environ):
        if k.startswith("HPCSCHED_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "5")
    monkeypatch.setenv("HPCSCHED_ACCUMULATION_STEPS", "3")
    j = ElasticJob(dataset_size=53, epochs=2, batch_size=15, seed=2, grad_noise_smoothing=0.5)
    yield j
    j.close()


def test_one_rank_with_accumulation_gives_the_global_mean_and_measures_the_noise(job):
    torch.manual_seed(0)
    X, y = torch.randn(53, 4, dtype=torch.float64), torch.randint(0, 3, (53,))
    net = torch.nn.Linear(4, 3).double()
    twin = torch.nn.Linear(4, 3).double()
    twin.load_state_dict(net.state_dict())
    model = ElasticDDP(job, net)
    loader = ElasticDataLoader(job, TensorDataset(X, y))
    job.register(model=model)
    for step in job.steps():
        net.zero_grad()
        for xb, yb in loader.micro_batches(step):
            F.cross_entropy(model(xb), yb).backward()   # mean over the micro-batch
        twin.zero_grad()
        for idx in step.micro_batches:
            if idx:
                (F.cross_entropy(twin(X[idx]), y[idx], reduction="sum") / step.global_samples).backward()
        for p, q in zip(net.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12)
    assert model.wraps == 0                      # one rank: nothing to reduce, no DDP
    assert job.grad_noise is not None            # the micro-batch estimator ran


def test_checkpoints_hold_the_modules_own_state_dict(job):
    net = torch.nn.Linear(4, 3)
    model = ElasticDDP(job, net)
    assert model.state_dict().keys() == net.state_dict().keys() == {"weight", "bias"}
    other = torch.nn.Linear(4, 3)
    model.load_state_dict(other.state_dict())
    assert torch.equal(net.weight, other.weight)


def test_a_training_forward_outside_the_loaders_micro_batches_is_refused(job):
    model = ElasticDDP(job, torch.nn.Linear(4, 3))
    with pytest.raises(RuntimeError, match="micro_batches"):
        model(torch.zeros(2, 4))
    with torch.no_grad():
        assert model(torch.zeros(2, 4)).shape == (2, 3)
    model.eval()
    assert model(torch.zeros(2, 4)).shape == (2, 3)


class _Dict(torch.nn.Module):
    """A model whose output is a mapping with a tensor and a tuple (as Hugging Face's)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3).double()

    def forward(self, x):
        z = self.lin(x)
        return {"logits": z, "extra": (z.sum(), 1)}


def test_the_weights_reach_every_tensor_of_a_structured_output(job):
    torch.manual_seed(1)
    X, y = torch.randn(53, 4, dtype=torch.float64), torch.randint(0, 3, (53,))
    net, plain = _Dict(), _Dict()
    plain.load_state_dict(net.state_dict())
    model = ElasticDDP(job, net)
    loader = ElasticDataLoader(job, TensorDataset(X, y))
    for step in job.steps():
        net.zero_grad()
        for xb, yb in loader.micro_batches(step):
            out = model(xb)
            (F.cross_entropy(out["logits"], yb) + 0.1 * out["extra"][0] / len(yb)).backward()
        plain.zero_grad()
        for idx in step.micro_batches:
            if idx:
                out = plain(X[idx])
                ((F.cross_entropy(out["logits"], y[idx], reduction="sum") + 0.1 * out["extra"][0])
                 / step.global_samples).backward()
        for p, q in zip(net.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12)
