"""Who may see and act on which job: a user their own jobs; root and the admin group all.

The owner of a job is the user Slurm says submitted it (``squeue``'s ``user_name``), never
anything a user can write (a job directory, a link, a spec file). ``hpcsched resize`` refuses
another user's job before it reads or writes any of that job's files; ``hpcsched status`` lists a
user's own jobs only and refuses the details of another's.

The admin group is ``[daemon] admin_group`` of the system's configuration file,
``/etc/hpcsched/hpcsched.toml`` (:data:`hpcsched.daemon.config.DEFAULT_PATH`), by default
``hpcsched-admin`` (which does not exist until an admin creates it: then only root sees every
job); ``""`` names none. Nothing the caller controls chooses it: neither ``$HPCSCHED_CONFIG``
(that file may be the user's own) nor ``$HPCSCHED_ADMIN_GROUP``, which older versions read and
which is now ignored with a warning when it names another group. A configuration file that
exists but cannot be read or is invalid gives no admin group (only root sees every job).

Membership comes from the system's group database: the caller's user is in the group when it is
their primary group (``/etc/passwd``) or when ``os.getgrouplist`` (``/etc/group``, LDAP, sssd ...)
lists it for them; never from the environment.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: read by hpcsched before issue 33; now ignored (a user can set it to their own group)
ENV_ADMIN_GROUP = "HPCSCHED_ADMIN_GROUP"
DEFAULT_ADMIN_GROUP = "hpcsched-admin"

_warned_env: set[tuple[str, str]] = set()


class NotYourJob(PermissionError):
    """The job belongs to another user (``str``: a message for that user)."""


@dataclass(frozen=True)
class Caller:
    """The user running a command: name, and whether they may see and act on every job."""

    user: str
    admin: bool

    @classmethod
    def current(cls) -> Caller:
        """The process's effective user; admin if root or, per the group database, in the
        configured admin group (:func:`admin_group`)."""
        uid = os.geteuid()
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:            # a uid without a passwd entry: never an admin, owns nothing
            return cls(user=f"uid {uid}", admin=False)
        return cls(user=pw.pw_name, admin=uid == 0 or in_admin_group(pw.pw_name, pw.pw_gid))

    def may_act_on(self, owner: str) -> bool:
        """Whether this caller may see the details of, and resize, a job Slurm says ``owner``
        submitted."""
        return self.admin or (bool(owner) and owner == self.user)

    def check(self, job_id: str, owner: str) -> None:
        """Raises :class:`NotYourJob` unless :meth:`may_act_on` ``owner``'s job ``job_id``."""
        if not self.may_act_on(owner):
            group = admin_group()
            who = f"owner, root and the {group!r} group" if group else "owner and root"
            raise NotYourJob(f"job {job_id} is not yours (it belongs to another user); only its "
                             f"{who} may see or change it")


def admin_group() -> str:
    """The admin group's name: ``[daemon] admin_group`` of ``/etc/hpcsched/hpcsched.toml``
    (default ``hpcsched-admin`` when the file does not exist); ``""``: no admin group (the
    file names none, or it exists but cannot be read or is invalid).

    ``$HPCSCHED_CONFIG`` and ``$HPCSCHED_ADMIN_GROUP`` are not read: a caller could point them
    at a file or group of their own.
    """
    from hpcsched.daemon import config

    try:
        group = config.load(env={}).daemon.admin_group.strip()
    except config.ConfigError as exc:
        log.debug("no admin group (only root sees every job): %s", exc)
        group = ""
    forged = os.environ.get(ENV_ADMIN_GROUP, "")
    if forged and forged != group and (forged, group) not in _warned_env:
        _warned_env.add((forged, group))
        log.warning("$%s=%s is ignored: the admin group is [daemon] admin_group in %s (%s)",
                    ENV_ADMIN_GROUP, forged, config.DEFAULT_PATH,
                    repr(group) if group else "none")
    return group


def in_admin_group(user: str, primary_gid: int) -> bool:
    """Whether ``user`` (whose primary group is ``primary_gid``) is in :func:`admin_group`,
    per the system's group database (``grp.getgrnam``, ``os.getgrouplist``)."""
    name = admin_group()
    if not name:
        return False
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return False
    if gid == primary_gid:
        return True
    try:
        return gid in os.getgrouplist(user, primary_gid)
    except OSError as exc:          # the group database did not answer: not an admin
        log.warning("cannot read %s's groups from the group database: %s", user, exc)
        return False


__all__ = ["Caller", "NotYourJob", "admin_group", "in_admin_group"]
