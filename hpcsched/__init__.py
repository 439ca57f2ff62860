"""hpcsched: an elastic meta-scheduler for deep-learning training jobs on Slurm GPU clusters.

See ``docs/`` and the README for the user-facing story; ``docs/control-protocol.md`` for the
daemon <-> job protocol.
"""

__version__ = "0.1.0"
