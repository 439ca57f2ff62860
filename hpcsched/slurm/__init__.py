"""Every Slurm call and every Slurm text format, behind one narrow interface.

* :mod:`hpcsched.slurm.commands`: running Slurm's commands (argument lists, never a shell;
  timeouts; one call counter) and the ``scontrol`` recipes the mechanism uses.
* :mod:`hpcsched.slurm.observe`: the backend interface (:class:`~hpcsched.slurm.observe.Backend`)
  that observes the cluster in one call per round, through the CLI or pyslurm.
* :mod:`hpcsched.slurm.devcluster`: the local Slurm used for development, demos and tests.

The names below are re-exported so that ``from hpcsched import slurm; slurm.job_info(...)``
reads as the Slurm API it is.
"""

from hpcsched.slurm.commands import (  # noqa: F401
    DEFAULT_TIMEOUT,
    JobInfo,
    SlurmError,
    SlurmUnavailable,
    calls,
    expand_hostlist,
    gpus_from_tres,
    hostnames,
    job_info,
    node_addr,
    parse_resize_script,
    parse_squeue_json,
    requeue,
    run,
    squeue,
    update_job,
)
