"""The pure job-view builder the daemon and the simulator share (:mod:`hpcsched.views.build`):
from a job's facts to the policies' :class:`~hpcsched.model.snapshot.JobView`, and from an
observation to the :class:`~hpcsched.model.snapshot.ClusterSnapshot`. Imports ``model``,
``perf``, ``slurm`` and ``protocol`` (``docs/architecture.md``)."""
