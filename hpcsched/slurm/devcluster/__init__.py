"""A real, local Slurm 22.05 cluster for development and tests: ``hpcsched devcluster up|down|status``.

``up`` starts, on this one host and as root, everything a small GPU cluster needs:

* ``munged`` (reused when one is already running),
* MariaDB on its own data directory, socket and port (16820), used by
* ``slurmdbd`` (port 16819), so that accounting, ``sacct`` and repeated job updates work,
* ``slurmctld`` (port 16817), ``ClusterName=lab``, default partition ``gpu``,
* one ``slurmd -N nK`` per emulated node ``n1..nN`` (``NodeAddr=127.0.0.K``, ``Port=17000+K``),
  each with ``--cpus`` CPUs and ``--gpus`` fake GPUs (character devices ``STATE/dev/gpuI``,
  major 195, so that the ``gpu`` GRES has the ``File=`` that Slurm 22.05 requires).

It waits, polling with deadlines, until every node is ``idle`` in ``sinfo`` (or ``mixed``/``allocated``
when jobs restored from saved state still run on it). ``down`` stops only the
daemons ``up`` started, by PID file, in the order slurmd, slurmctld, slurmdbd, MariaDB, munged.

Every measured fact this package relies on (multiple-slurmd build, fake GPU device files, the
TRES/slurmdbd requirement, zombie processes because PID 1 does not reap, slurmd before slurmctld
on stop, timeouts on every Slurm client call, never the ``slurm-wlm-emulator`` package) is in
``docs/slurm-22.05-notes.md``, sections 1, 2 and 6.

Files under the state directory ``STATE`` (``--state-dir``, env ``HPCSCHED_DEVCLUSTER_DIR``,
default ``/var/lib/hpcsched/devcluster``)::

    etc/slurm.conf gres.conf cgroup.conf slurmdbd.conf (600)   dev/gpu0..       state/  spool/nK/
    run/*.pid (every daemon started)   log/*.log   db/ (MariaDB)   cluster.json (manifest)   .lock

``--slurm 24.11`` / ``--slurm 26.05`` run those Slurm versions instead, from a Debian trixie / sid
debootstrap chroot with their own munged, ports and state directory and no slurmdbd, beside the
host's 22.05 cluster: :mod:`~hpcsched.slurm.devcluster.chroot` (facts: ``docs/slurm-versions.md``).

Modules, one concern each:

* :mod:`~hpcsched.slurm.devcluster.base`: constants (ports, names), :class:`DevClusterError`, the
  state-directory :class:`~hpcsched.slurm.devcluster.base.Layout`, running commands, polling;
* :mod:`~hpcsched.slurm.devcluster.config`: the configuration files (:func:`render_configs`, pure);
* :mod:`~hpcsched.slurm.devcluster.install`: apt packages, the emulator fix, the MUNGE key;
* :mod:`~hpcsched.slurm.devcluster.processes`: PID files, liveness (zombies count as dead), stopping;
* :mod:`~hpcsched.slurm.devcluster.daemons`: starting munged, MariaDB, slurmdbd, slurmctld, slurmd;
  waiting for idle nodes;
* :mod:`~hpcsched.slurm.devcluster.cluster`: the Python API below;
* :mod:`~hpcsched.slurm.devcluster.chroot`: the same for 24.11 and 26.05 in a chroot;
* :mod:`~hpcsched.slurm.devcluster.cli`: the ``hpcsched devcluster`` click group.

Python API: :func:`up`, :func:`down`, :func:`is_up`, :func:`status`, :func:`slurm_env`,
:func:`render_configs`, :func:`default_state_dir`. Errors are raised as :class:`DevClusterError`.
"""

from hpcsched.slurm.devcluster.base import (  # noqa: F401
    CLUSTER_NAME,
    DEFAULT_STATE_DIR,
    PARTITION,
    STATE_DIR_ENV,
    DevClusterError,
    default_state_dir,
)
from hpcsched.slurm.devcluster.cli import devcluster  # noqa: F401
from hpcsched.slurm.devcluster.cluster import down, is_up, slurm_env, status, up  # noqa: F401
from hpcsched.slurm.devcluster.config import node_names, render_configs  # noqa: F401
