"""Public name of the elastic training API: ``from hpcsched.elastic import ElasticJob``.

The code lives in :mod:`hpcsched.job`; this module re-exports it so training scripts keep
working. :class:`ElasticDataLoader` (:mod:`hpcsched.job.loader`) and :class:`ElasticDDP`
(:mod:`hpcsched.job.ddp`) wrap torch's DataLoader and DistributedDataParallel
(``docs/training-api.md``); they are imported on first use, so importing this module does not
import torch.
"""

from hpcsched.job.elastic import (  # noqa: F401
    ElasticJob,
    GradientNoiseEstimator,
    Step,
    epoch_permutation,
    rank_micro_batches,
    two_batch_estimate,
)

_LAZY = {"ElasticDataLoader": "hpcsched.job.loader", "ElasticDDP": "hpcsched.job.ddp",
         "adam_square_root_rule": "hpcsched.job.scaling"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
