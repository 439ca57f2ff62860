"""The shipped priors of Pollux's step-time model, one per application of the Pollux traces.

Per application (cifar10, imagenet, bert, ncf, deepspeech2, yolov3): the seven
:class:`~hpcsched.perf.pollux.PerfParams` fitted to all of its measured placements and local
batch sizes, in ``hpcsched/data/pollux/priors.json`` (absolute times are the traces' NVIDIA T4
GPUs; see ``SOURCE.md`` there). ``tools/build_pollux_priors.py`` rebuilds the file from the
traces. The file is static package data, read once; nothing here reads anything else.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from hpcsched.perf.pollux import PerfParams

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "pollux"
PRIORS_FILE = DATA_DIR / "priors.json"
APPLICATIONS = ("cifar10", "imagenet", "bert", "ncf", "deepspeech2", "yolov3")


@lru_cache(maxsize=1)
def _priors() -> dict[str, PerfParams]:
    try:
        doc = json.loads(PRIORS_FILE.read_text())
    except FileNotFoundError:
        return {}
    return {app: PerfParams.from_dict(v["params"]) for app, v in doc["applications"].items()}


def prior_apps() -> tuple[str, ...]:
    """Applications with a shipped prior."""
    return tuple(sorted(_priors()))


def application_key(application: str | None) -> str:
    """The name ``application`` is known by in the priors, the applications' shared tables
    (:mod:`hpcsched.perf.shared`) and the store: without surrounding spaces, lower case (``""``
    for ``None``). One rule, so that ``CIFAR10 `` and ``cifar10`` are one application
    everywhere."""
    return (application or "").strip().lower()


def prior_for(application: str) -> PerfParams | None:
    """The shipped step-time parameters fitted to the Pollux traces of ``application``
    (:func:`application_key`), or ``None`` for an application without traces."""
    return _priors().get(application_key(application))


def clear_cache() -> None:
    """Read the shipped file again on next use (after the tooling rewrote it)."""
    _priors.cache_clear()
