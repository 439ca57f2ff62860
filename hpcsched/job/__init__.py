"""Everything that runs for a job: submission (``hpcsub``), the launcher and workers inside the
Slurm allocation, and the elastic training API (:class:`hpcsched.elastic.ElasticJob`).

Nothing here imports the daemon, the policies or the simulator: a job needs only
:mod:`hpcsched.protocol` (the files it shares with the daemon) and, inside its allocation,
:mod:`hpcsched.slurm`.
"""
