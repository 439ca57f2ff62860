"""PAL's application classes and how much each suffers from per-GPU variability (Jain et al.,
"PAL: A Variability-Aware Policy for Scheduling ML Workloads in GPU Clusters", SC'24;
arXiv:2408.11919).

PAL's observation (§II-§III of the paper): identical GPUs run the same kernel at different speeds,
the spread depends on the application (ResNet-50-like compute-bound training suffers most,
PageRank-like memory-bound work hardly at all), and a data-parallel job runs at the pace of its
slowest GPU. PAL therefore keeps, per *application class*, a slowdown multiplier per GPU
(1 = median GPU, > 1 = slower), bins the GPUs of each class with K-Means
(:mod:`hpcsched.policies.placement.binning`), and lets the classes that are most sensitive to
variability choose GPUs first (§III, design). This module holds:

* :data:`APP_CLASSES` / :func:`class_key` -- the class of a job (PAL's ``A``..``D``, or a Pollux
  application name standing for its class);
* :func:`profiles_from_views` -- the snapshot's :class:`~hpcsched.model.snapshot.GPUView` as
  per-class slowdowns;
* :func:`sensitivity` -- how much a class suffers from variability, which orders the classes.

Pure: no I/O. The measured data (``hpcsched/data/pal``) reaches a policy only through the
snapshot's GPU views; the simulator draws them (:func:`hpcsched.sim.physics.draw_gpu_slowdowns`,
the one Longhorn sampler) and the daemon measures them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hpcsched.model.snapshot import GPUView
from hpcsched.perf.priors import application_key

Profiles = Mapping[str, Mapping]  # app class -> {gpu key -> slowdown multiplier}


# PAL's variability class of each Pollux application (PAL: A = ResNet-50-like convolutional
# nets, the most sensitive; B/C = BERT-like; D = insensitive), so a job named by its application
# (which also selects its throughput prior) is placed by its class.
APP_CLASSES = {"imagenet": "A", "cifar10": "A", "yolov3": "A", "bert": "B", "deepspeech2": "B",
               "ncf": "D"}


def class_key(app_class: str) -> str:
    """PAL's ``classA`` and our ``A`` name the same class: strip a leading ``class``; a Pollux
    application name (``cifar10``) stands for its class (:data:`APP_CLASSES`)."""
    mapped = APP_CLASSES.get(application_key(app_class))
    if mapped is not None:
        return mapped
    return app_class[5:] if app_class.startswith("class") and len(app_class) > 5 else app_class


def profiles_from_views(gpus: Sequence[GPUView]) -> dict[str, dict[tuple[str, int], float]]:
    """The snapshot's GPUs as profiles: ``{class: {(node, index): slowdown}}``."""
    out: dict[str, dict[tuple[str, int], float]] = {}
    for g in gpus:
        for c, v in g.slowdown:
            out.setdefault(c, {})[(g.node, g.index)] = float(v)
    return out


# --------------------------------------------------------------------------- sensitivity

def sensitivity(app_class: str, profiles: Profiles) -> float:
    """How much ``app_class`` suffers from GPU variability: ``p95 / p50 - 1`` of its per-GPU
    slowdowns, i.e. how much slower than the median GPU the slowest 5 % of GPUs run it
    (0 when unmeasured or fewer than two GPUs).

    PAL (§III) lets the most sensitive classes choose GPUs first. A data-parallel job runs at
    its slowest GPU's pace, so the upper tail is what placement protects a job from; a
    quantile rather than the maximum or the coefficient of variation keeps one broken GPU
    (Longhorn has ResNet runs at 3.4x) from deciding the order alone, and the upper tail rather
    than the p5..p95 spread keeps a few *fast* GPUs (Longhorn's PageRank GPUs have a 0.97 group)
    from ranking an insensitive class above a sensitive one. Shipped data: 32-GPU file
    A 0.11 > B = C 0.057 > D 0.001; Longhorn A 0.21 > B = C 0.013 > D 0.003 -- PAL's order.
    """
    per = profiles.get(app_class)
    if per is None:
        per = profiles.get(class_key(app_class)) or profiles.get("class" + app_class)
    if not per or len(per) < 2:
        return 0.0
    x = np.fromiter(per.values(), dtype=float)
    p50, p95 = np.quantile(x, [0.5, 0.95])
    return max(0.0, float(p95 / p50 - 1.0)) if p50 > 0 else 0.0
