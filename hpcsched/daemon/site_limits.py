"""The site's limits on elastic jobs, enforced by the daemon itself (issue 33).

Slurm's job_submit plugin (``slurm-plugins/job_submit.lua``) is the first line: it refuses a
job whose largest size breaks the site's limits and tags the largest size it accepted in the
job's AdminComment (``hpcsched:elastic job=<uid> max_gpus=<n>``), which only Slurm operators can
set. But the limits the daemon plans with come from the job's ``spec.json``, which its user
writes and may rewrite after submission, and the plugin may not be installed. So every round
the daemon caps each job's largest size (:attr:`~hpcsched.protocol.limits.JobLimits.max_nodes`)
at the smallest of:

* what the spec says;
* the plugin's tag (the size Slurm accepted);
* the site's ``max_gpus`` for the job's partition, read from the plugin's own settings file,
  ``job_submit_hpcsched.conf`` (``[daemon] site_limits``; by default beside ``slurm.conf``),
  so one file states the site's limits for both: ``max_gpus = N`` for every partition,
  ``partition.<name>.max_gpus = N`` for one ("key = number" lines, ``#`` or ``--`` comments;
  other keys, such as ``max_time``, are Slurm's business; ``extension_qos = NAME`` names the
  QOS of extension jobs, ``submit_stamp = /PATH`` the file the plugin rewrites at other users'
  submissions).

A job never shrinks below its own smallest size for it (the plugin refuses such a job at
submission). A spec that claims more than the tag is logged once per job, as a warning.
Extension jobs are not judged on their own: the daemon plans a job's extensions within its
capped limits.

:func:`read_site_limits` and :func:`tagged_max_gpus` parse; :func:`cap` is pure.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcsched.protocol.limits import JobLimits

log = logging.getLogger("hpcsched.daemon.site_limits")

#: the plugin's settings file's name (``slurm-plugins/job_submit.lua``'s ``CONFIG_NAME``)
CONFIG_NAME = "job_submit_hpcsched.conf"
_LINE = re.compile(r"^\s*([\w.\-]+)\s*=\s*(\d+)\s*$")
_QOS_LINE = re.compile(r"^\s*extension_qos\s*=\s*([\w.\-]+)\s*$")
_STAMP_LINE = re.compile(r"^\s*submit_stamp\s*=\s*(/[\w.\-/]+)\s*$")
_TAG = re.compile(r"(?:^|\s)hpcsched:elastic\b.*?\bmax_gpus=(\d+)")


@dataclass(frozen=True)
class SiteLimits:
    """GPUs an elastic job may grow to: ``max_gpus`` in every partition (None: no limit) and
    per partition (``partitions``, overriding it); the QOS the plugin puts extension jobs
    in (``extension_qos``; None: the primary's), which :mod:`hpcsched.daemon.preflight` checks
    is preemptible; and the file it rewrites at every submission that is not hpcsched's
    (``submit_stamp``; None: none), which the daemon watches between rounds."""

    max_gpus: int | None = None
    partitions: dict[str, int] = field(default_factory=dict)
    extension_qos: str | None = None
    submit_stamp: str | None = None

    def max_gpus_in(self, partition: str) -> int | None:
        """The limit for a job in ``partition`` (None: none)."""
        return self.partitions.get(partition, self.max_gpus)


def default_path() -> Path:
    """``job_submit_hpcsched.conf`` beside the ``slurm.conf`` Slurm's commands read
    (``$SLURM_CONF``, else ``/etc/slurm/slurm.conf``)."""
    return Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent / CONFIG_NAME


def read_site_limits(path: Path | str | None) -> SiteLimits:
    """The ``max_gpus`` settings of the plugin's settings file at ``path`` (None or ""
    :func:`default_path`). A missing or unreadable file is no limit; a line that is not
    ``key = number`` is ignored with a warning, as the plugin does."""
    p = Path(path) if path else default_path()
    try:
        text = p.read_text()
    except OSError:
        return SiteLimits()
    every, per, qos, stamp = None, {}, None, None
    for n, line in enumerate(text.splitlines(), 1):
        body = re.sub(r"(#|--).*$", "", line)
        if not body.strip():
            continue
        if (q := _QOS_LINE.match(body)) is not None:
            qos = q.group(1)
            continue
        if (st := _STAMP_LINE.match(body)) is not None:
            stamp = st.group(1)
            continue
        m = _LINE.match(body)
        if m is None:
            log.warning("%s line %d ignored (want 'key = number'): %s", p, n, line.strip())
            continue
        key, value = m.group(1), int(m.group(2))
        if key == "max_gpus":
            every = value
        elif key.startswith("partition.") and key.endswith(".max_gpus"):
            per[key[len("partition."):-len(".max_gpus")]] = value
    return SiteLimits(every, per, qos, stamp)


def tagged_max_gpus(admin_comment: str) -> int | None:
    """The largest size the job_submit plugin accepted, from its AdminComment tag
    (``hpcsched:elastic job=<uid> max_gpus=<n>``); None: no tag."""
    m = _TAG.search(admin_comment or "")
    return int(m.group(1)) if m else None


def cap(limits: JobLimits, *bounds: int | None) -> JobLimits:
    """``limits`` with ``max_nodes`` at most the smallest of ``bounds`` (GPUs; None: no bound)
    in whole nodes, never below ``min_nodes``; the same object when nothing caps it."""
    known = [b for b in bounds if b is not None]
    if not known or min(known) >= limits.max_gpus:
        return limits
    nodes = max(limits.min_nodes, min(known) // limits.workers_per_node)
    return replace(limits, max_nodes=nodes) if nodes < limits.max_nodes else limits


_warned: set[tuple[str, int, int]] = set()


def job_limits(job_id: str, spec_limits: JobLimits, admin_comment: str, partition: str,
               site: SiteLimits) -> JobLimits:
    """A managed job's limits to plan with: its spec's, capped (:func:`cap`) at the plugin's
    tag and the site's limit for its partition (module docstring). A spec claiming more than
    the tag is warned about once per job and claim."""
    tagged = tagged_max_gpus(admin_comment)
    if tagged is not None and spec_limits.max_gpus > tagged \
            and (key := (job_id, spec_limits.max_gpus, tagged)) not in _warned:
        _warned.add(key)
        log.warning("job %s: its spec.json says up to %d GPUs, Slurm's job_submit plugin "
                    "accepted %d: planned within %d", job_id, spec_limits.max_gpus, tagged,
                    tagged)
    return cap(spec_limits, tagged, site.max_gpus_in(partition))


__all__ = ["SiteLimits", "cap", "default_path", "job_limits", "read_site_limits",
           "tagged_max_gpus"]
