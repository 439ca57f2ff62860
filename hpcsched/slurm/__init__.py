"""Every Slurm call and every Slurm text format, behind one narrow interface.

* :mod:`hpcsched.slurm.commands`: running Slurm's commands (argument lists, never a shell;
  timeouts; one call counter) and the ``scontrol``/``squeue`` wrappers the mechanism uses.
* :mod:`hpcsched.slurm.parse`: the formats (``squeue --json``, ``sinfo --json``, ``squeue``'s
  planned nodes of pending jobs, the resize script); pure.
* :mod:`hpcsched.slurm.gres`: the one GRES/TRES GPU parser, :func:`~hpcsched.slurm.gres.gpu_count`; pure.
* :mod:`hpcsched.slurm.hostlist`: hostlist expressions (``n[1-3]``); pure.
* :mod:`hpcsched.slurm.errors`: :class:`SlurmError` and :class:`SlurmUnavailable`.
* :mod:`hpcsched.slurm.control`: the operations the resize mechanism acts through
  (:class:`~hpcsched.slurm.control.SlurmControl`), over the commands above.
* :mod:`hpcsched.slurm.observe`: the backend interface (:class:`~hpcsched.slurm.observe.Backend`)
  that observes the cluster in one call per round, through the CLI or pyslurm.
* :mod:`hpcsched.slurm.devcluster`: the local Slurm used for development, demos and tests.

The names below are re-exported so that ``from hpcsched import slurm; slurm.job_info(...)``
reads as the Slurm API it is.
"""

from hpcsched.slurm.commands import (  # noqa: F401
    DEFAULT_TIMEOUT,
    calls,
    cancel,
    count_call,
    hostnames,
    job_info,
    node_addr,
    nodes,
    requeue,
    run,
    squeue,
    submit,
    time_left,
    update_job,
)
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable  # noqa: F401
from hpcsched.slurm.gres import gpu_count  # noqa: F401
from hpcsched.slurm.hostlist import expand_hostlist  # noqa: F401
from hpcsched.slurm.parse import (  # noqa: F401
    JobInfo,
    parse_resize_script,
    parse_squeue_json,
)
