"""One daemon per cluster: a lease in the store every daemon of the cluster shares.

A lock file only excludes daemons on one host; two login nodes could each run one on the same
jobs. The daemon that holds the lease (the ``daemon_lease`` row, until its ``expires_at``) runs
rounds and renews it every round and every actuation tick; any other daemon on the same store is
a **standby**: it decides and touches nothing, and takes the lease over once it has lapsed
(``[daemon] lease_seconds`` after its holder's last renewal: a holder killed, or cut off from
the store), so a standby takes over within one lease period. A holder that stops cleanly
releases the lease at once. The journal is in the same store, so the new holder resumes the
open resizes where the old one left them, and no action is applied twice.

Taking or renewing the lease is one write transaction (SQLite's write lock taken at once;
``SELECT ... FOR UPDATE`` elsewhere), so two daemons never both hold it. Clocks: ``expires_at``
is the holder's clock plus the lease; daemons on hosts whose clocks differ by more than a small
part of the lease should not share a store (NTP keeps login nodes within milliseconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError

from hpcsched.daemon.store.schema import DaemonLease

#: the daemon's lease (one per store)
DAEMON = "daemon"


@dataclass(frozen=True)
class Lease:
    """What a :meth:`LeaseMixin.take_lease` found: ``held`` by the caller or not, its
    ``holder`` ("" none) and when it lapses (``expires_at``, Unix seconds)."""

    held: bool
    holder: str
    expires_at: float


class LeaseMixin:
    """The lease's methods of :class:`~hpcsched.daemon.store.Store` (which provides ``_write``)."""

    def take_lease(self, holder: str, seconds: float, now: float | None = None,
                   name: str = DAEMON, gone: str | None = None) -> Lease:
        """Take or renew lease ``name`` for ``holder`` until ``now + seconds``: done when nobody
        holds it, ``holder`` does, its holder's has lapsed, or its holder is ``gone`` (a holder
        the caller knows has stopped: on its own host, the daemon whose lock it now holds);
        otherwise nothing changes.

        Raises:
            ValueError: ``seconds`` is not > 0.
        """
        if not seconds > 0:
            raise ValueError(f"a lease lasts > 0 seconds, not {seconds}")
        now = time.time() if now is None else now
        try:
            with self._write() as s:
                row = s.get(DaemonLease, name, with_for_update=True)
                if row is None:
                    s.add(DaemonLease(name=name, holder=holder, acquired_at=now, renewed_at=now,
                                      expires_at=now + seconds))
                    return Lease(True, holder, now + seconds)
                if row.holder != holder and row.expires_at > now and row.holder != gone:
                    return Lease(False, row.holder, row.expires_at)
                if row.holder != holder:
                    row.holder, row.acquired_at = holder, now
                row.renewed_at, row.expires_at = now, now + seconds
                return Lease(True, holder, row.expires_at)
        except IntegrityError:   # another daemon inserted the row in the same instant
            return self.take_lease(holder, seconds, now, name, gone)

    def release_lease(self, holder: str, name: str = DAEMON) -> None:
        """Give lease ``name`` up at once if ``holder`` holds it (a clean stop)."""
        with self._write() as s:
            row = s.get(DaemonLease, name, with_for_update=True)
            if row is not None and row.holder == holder:
                row.expires_at = 0.0


__all__ = ["DAEMON", "Lease", "LeaseMixin"]
