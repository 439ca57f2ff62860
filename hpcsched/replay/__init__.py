"""``hpcsched replay``: a workload through the real Slurm cluster, against the simulator.

Each job of a workload (anything :func:`hpcsched.sim.workload.load_workload` reads; Pollux
applications' convergence jobs only) is submitted with the real ``hpcsub`` at its arrival time x
``--scale``, as the emulated application (``jobscripts/examples/emulated.py``) with the Slurm
shape and resize limits the simulator gives it; the run is watched until every job has ended,
each job's submit/start/end is read from Slurm, and a per-job CSV and a summary with the keys of
``hpcsched simulate --json`` are written. ``--compare`` simulates the same scaled workload on the
same cluster shape with the daemon's policy and this cluster's measured resize costs.

Modules: :mod:`~hpcsched.replay.plan` (pure: what to submit, when), :mod:`~hpcsched.replay.slurmread`
(Slurm's text: cluster shape, job times, sacct), :mod:`~hpcsched.replay.submit` (``hpcsub``),
:mod:`~hpcsched.replay.watch` (the submit-and-poll loop), :mod:`~hpcsched.replay.report` (CSV and
summary), :mod:`~hpcsched.replay.compare` (the simulator's prediction, the table, the plot),
:mod:`~hpcsched.replay.cli` (the command). Docs: ``docs/replay.md``.

Units: seconds (times in the outputs are from the replay's start), GPUs, samples.
"""


class ReplayError(RuntimeError):
    """Something that stops a replay; the message is one line for the user."""
