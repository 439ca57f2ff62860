"""Who may see and act on which job: a user their own jobs; root and the admin group all.

The owner of a job is the user Slurm says submitted it (``squeue``'s ``user_name``), never
anything a user can write (a job directory, a link, a spec file). ``hpcsched resize`` refuses
another user's job before it reads or writes any of that job's files; ``hpcsched status`` lists a
user's own jobs only and refuses the details of another's.

The admin group is ``$HPCSCHED_ADMIN_GROUP``, by default ``hpcsched-admin`` (which does not
exist until an admin creates it: then only root sees every job). Group membership is the
process's own groups (``os.getgroups()``), as for file permissions.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

ENV_ADMIN_GROUP = "HPCSCHED_ADMIN_GROUP"
DEFAULT_ADMIN_GROUP = "hpcsched-admin"


class NotYourJob(PermissionError):
    """The job belongs to another user (``str``: a message for that user)."""


@dataclass(frozen=True)
class Caller:
    """The user running a command: name, and whether they may see and act on every job."""

    user: str
    admin: bool

    @classmethod
    def current(cls) -> Caller:
        """The process's effective user; admin if root or in the admin group."""
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:            # a uid without a passwd entry: never an admin, owns nothing
            return cls(user=f"uid {uid}", admin=False)
        return cls(user=name, admin=uid == 0 or _in_admin_group())

    def may_act_on(self, owner: str) -> bool:
        """Whether this caller may see the details of, and resize, a job Slurm says ``owner``
        submitted."""
        return self.admin or (bool(owner) and owner == self.user)

    def check(self, job_id: str, owner: str) -> None:
        """Raises :class:`NotYourJob` unless :meth:`may_act_on` ``owner``'s job ``job_id``."""
        if not self.may_act_on(owner):
            raise NotYourJob(f"job {job_id} is not yours (it belongs to another user); only its "
                             f"owner, root and the {admin_group()!r} group may see or change it")


def admin_group() -> str:
    """The admin group's name."""
    return os.environ.get(ENV_ADMIN_GROUP) or DEFAULT_ADMIN_GROUP


def _in_admin_group() -> bool:
    try:
        gid = grp.getgrnam(admin_group()).gr_gid
    except KeyError:
        return False
    return gid == os.getegid() or gid in os.getgroups()


__all__ = ["Caller", "NotYourJob", "admin_group"]
