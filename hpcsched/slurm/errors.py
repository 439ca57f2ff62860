"""The two errors every Slurm call and parser in :mod:`hpcsched.slurm` raises, and the test for
"the controller did not answer" that decides between them.

Kept apart from :mod:`hpcsched.slurm.commands` so that the pure parsers
(:mod:`~hpcsched.slurm.parse`, :mod:`~hpcsched.slurm.hostlist`) can raise them without importing
the module that runs commands.
"""

from __future__ import annotations

import re


class SlurmError(RuntimeError):
    """A Slurm command failed, or printed something that is not what Slurm documents;
    ``str()`` carries Slurm's own message."""


class SlurmUnavailable(SlurmError):
    """The Slurm controller did not answer (timed out or refused the connection)."""


# What Slurm 22.05's clients and libslurm print when slurmctld cannot be reached
# (docs/slurm-22.05-notes.md §6.3: a dead controller makes the clients retry, then say so).
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Could not establish a configuration source|Zero Bytes were transmitted",
    re.IGNORECASE,
)


def says_unreachable(message: object) -> bool:
    """True when a Slurm message (stderr line, JSON error entry, pyslurm exception text) says
    that the controller could not be reached."""
    return bool(_UNREACHABLE.search(str(message)))
