"""The login-node service: the round, the resize state machine, the store, configuration and
status (``docs/architecture.md`` shows one round call by call).

* :mod:`hpcsched.daemon.round`: :class:`~hpcsched.daemon.round.Daemon`, one round top to bottom
  (each part timed: ``RoundReport.phases``); :mod:`hpcsched.daemon.service`: the service loop
  (``hpcsched daemon``: settings, lock and lease, metrics endpoint, rounds and ticks).
* :mod:`hpcsched.daemon.views`: the one job-view builder (the daemon's and the simulator's).
* :mod:`hpcsched.daemon.ingest`: job metrics into the store.
* :mod:`hpcsched.daemon.phases`: the resize state machine, pure (phases, transitions,
  ``next_step``); :mod:`hpcsched.daemon.actuator` executes it through a
  :class:`~hpcsched.slurm.control.SlurmControl`; :mod:`hpcsched.daemon.resize_cli` is
  ``hpcsched resize``.
* :mod:`hpcsched.daemon.store`: the SQLAlchemy store (schema, journal, ``hpcsched db``).
* :mod:`hpcsched.daemon.config`: the TOML configuration.
* :mod:`hpcsched.daemon.status`: ``hpcsched status``.
"""
