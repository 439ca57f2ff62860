"""The login-node service: the round, the actuator, the store, configuration and status.

* :mod:`hpcsched.daemon.round`: :class:`~hpcsched.daemon.round.Daemon`, one round top to bottom.
* :mod:`hpcsched.daemon.actuator`: applying resizes through control files and Slurm.
* :mod:`hpcsched.daemon.ingest`: job metrics into the store.
* :mod:`hpcsched.daemon.store`: the SQLite/SQLAlchemy store and the ``hpcsched db`` commands.
* :mod:`hpcsched.daemon.config`: the TOML configuration.
* :mod:`hpcsched.daemon.status`: ``hpcsched status``.
"""
