"""The resize script Slurm writes when a job's allocation changes, parsed (pure):
``slurm_job_<id>_resize.sh`` -> (variables to set, variables to unset)
(:func:`parse_resize_script`; also importable from :mod:`hpcsched.slurm.parse`).
"""

from __future__ import annotations

import re

_EXPORT = re.compile(r'export\s+([A-Za-z_][A-Za-z0-9_]*)=(?:"([^"]*)"|(\S*))')
_UNSET = re.compile(r"unset\s+([A-Za-z_][A-Za-z0-9_]*)")


def parse_resize_script(text: str) -> tuple[dict[str, str], list[str]]:
    """Parse ``slurm_job_<id>_resize.sh`` into (variables to set, variables to unset).

    Slurm writes ``export NAME="value"`` and ``unset NAME`` lines (22.05, measured: see the
    notes §3). Anything else is ignored.
    """
    setv: dict[str, str] = {}
    unset: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        m = _EXPORT.match(line)
        if m:
            setv[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
            continue
        m = _UNSET.match(line)
        if m:
            unset.append(m.group(1))
    return setv, unset
