"""Public name of the elastic training API: ``from hpcsched.elastic import ElasticJob``.

The code lives in :mod:`hpcsched.job`; this module re-exports it so training scripts keep
working.
"""

from hpcsched.job.elastic import (  # noqa: F401
    ElasticJob,
    GradientNoiseEstimator,
    Step,
    epoch_permutation,
    rank_micro_batches,
    two_batch_estimate,
)
