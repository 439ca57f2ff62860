"""PAL's locality x variability score, a node's speed for an application class, and the natural
order of node names (Jain et al., SC'24, §III). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from hpcsched.model.snapshot import GPUView
from hpcsched.policies.variability import class_key


def node_sort_key(name: str) -> tuple:
    """Natural order of node names (``n2`` before ``n10``): "lowest name first" and the order
    of ``JobTarget.placement``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def locality_factor(n_nodes: int, locality_penalty: float = 1.5) -> float:
    """PAL's ``L``: 1 for a job on one node, ``locality_penalty`` for one spanning nodes."""
    return 1.0 if n_nodes <= 1 else float(locality_penalty)


def placement_score(variability: float, n_nodes: int, locality_penalty: float = 1.5) -> float:
    """PAL's ``L x V`` score of a placement: slowest GPU's slowdown times the locality factor.

    Lower is better; it estimates how much slower than on one node of median GPUs the job runs.
    """
    return float(variability) * locality_factor(n_nodes, locality_penalty)


def gpus_by_node(gpus: Iterable[GPUView]) -> dict[str, list[GPUView]]:
    """The measured GPUs of each node."""
    out: dict[str, list[GPUView]] = {}
    for g in gpus:
        out.setdefault(g.node, []).append(g)
    return out


def class_in(app_class: str, classes: Iterable[str]) -> str:
    """The class name used in the GPU measurements for ``app_class`` (``classA`` == ``A``)."""
    cs = set(classes)
    for cand in (app_class, class_key(app_class), "class" + app_class):
        if cand in cs:
            return cand
    return app_class


def node_slowdowns(gpus: Sequence[GPUView], app_class: str) -> dict[str, float]:
    """Each measured node's speed for ``app_class``: the slowdown of its slowest GPU."""
    c = class_in(app_class, (k for g in gpus for k, _ in g.slowdown))
    return {n: max(g.slowdown_for(c) for g in gs) for n, gs in sorted(gpus_by_node(gpus).items())}


def job_slowdown(gpus: Sequence[GPUView], app_class: str, nodes: Sequence[str],
                 locality_penalty: float = 1.5) -> float:
    """How much slower than on one node of median GPUs a job of ``app_class`` runs on ``nodes``:
    :func:`placement_score` with ``V`` the slowest GPU of those nodes (unmeasured nodes 1.0).
    For the simulator and for allocation policies weighing layouts; 1.0 for no nodes."""
    names = sorted(set(nodes))
    if not names:
        return 1.0
    per = node_slowdowns(gpus, app_class)
    return placement_score(max(per.get(n, 1.0) for n in names), len(names), locality_penalty)
