"""This daemon's hold on the cluster's lease: active, or a standby (``docs/daemon.md``, "One
daemon per cluster"; the lease itself: :mod:`hpcsched.daemon.store.lease`).

:class:`Leadership` takes or renews the lease before every round and every actuation tick
(:meth:`Leadership.hold`); only while it holds it does the daemon decide or act. It logs each
change once: the lease taken (and from whom), a standby's wait (who holds it, until when), the
lease lost. A store that cannot be reached counts as the lease not renewed: the daemon goes on
only until its last renewal lapses, then stands by, so two daemons never act at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import time
from pathlib import Path

import click
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("hpcsched.daemon")


class Leadership:
    """The lease for ``holder`` (default: host, pid and a nonce), ``seconds`` long, in
    ``store`` (a :class:`~hpcsched.daemon.store.Store`)."""

    def __init__(self, store, seconds: float, holder: str | None = None):
        self.store, self.seconds = store, seconds
        self.host = socket.gethostname()
        self.holder = holder or f"{self.host} pid {os.getpid()} {secrets.token_hex(3)}"
        self.held = False
        self.until = 0.0          # when this daemon's last renewal lapses (Unix seconds)
        self._said = ""

    def hold(self) -> bool:
        """Take or renew the lease; True while this daemon holds it (module docstring)."""
        now = time.time()
        try:
            lease = self.store.take_lease(self.holder, self.seconds, now)
            if not lease.held and self._gone(lease.holder):
                # a daemon of this host whose process has ended (a restart after a kill): its
                # lease need not lapse first
                lease = self.store.take_lease(self.holder, self.seconds, now, gone=lease.holder)
        except SQLAlchemyError as exc:
            held = self.held and now < self.until
            self._say(f"lease not renewed: the store did not answer ({type(exc).__name__}); "
                      + (f"acting until it lapses in {self.until - now:.0f} s" if held
                         else "standing by"), logging.WARNING)
            self.held = held
            return held
        if lease.held:
            if not self.held:
                self._say(f"lease taken: this daemon ({self.holder}) runs the cluster's rounds "
                          f"(renewed every round; lapses {self.seconds:.0f} s after the last)")
            self.until = lease.expires_at
        elif self.held:
            self._say(f"lease lost to {lease.holder}: standing by", logging.WARNING)
        else:
            self._say(f"standby: the daemon {lease.holder} holds the lease (until "
                      f"{time.strftime('%H:%M:%S', time.localtime(lease.expires_at))}, renewed "
                      "every round); this one takes over once it lapses")
        self.held = lease.held
        return self.held

    def _gone(self, holder: str) -> bool:
        """``holder`` is a daemon of this host (``<host> pid <pid> ...``) whose process no
        longer exists. A pid reused since reads as alive: the lease then lapses as usual."""
        prefix = f"{self.host} pid "
        if not holder.startswith(prefix):
            return False
        try:
            pid = int(holder[len(prefix):].split()[0])
        except (ValueError, IndexError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:   # exists, another user's: alive
            return False
        return False

    def release(self) -> None:
        """Give the lease up (a clean stop), so a standby takes over at once."""
        if not self.held:
            return
        try:
            self.store.release_lease(self.holder)
            log.info("lease released")
        except SQLAlchemyError as exc:
            log.warning("lease not released (%s): a standby takes over when it lapses", exc)
        self.held = False

    def standby(self, stop) -> None:
        """Wait, as a standby, until the next try: a quarter of the lease (at most 5 s), or
        until ``stop()`` says to stop."""
        end = time.monotonic() + min(5.0, self.seconds / 4)
        while time.monotonic() < end and not stop():
            time.sleep(0.2)

    def _say(self, text: str, level: int = logging.INFO) -> None:
        if text.split(":")[0] != self._said.split(":")[0]:   # once per change of state
            log.log(level, "%s", text)
        self._said = text


class HostLock:
    """An exclusive lock file so only one daemon runs on this host (fcntl; released when the
    process dies). Across hosts, the store's lease decides (:class:`Leadership`)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise click.ClickException(
                f"another hpcsched daemon holds {self.path} (pid {other or '?'}); one per cluster")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd


__all__ = ["HostLock", "Leadership"]
