"""``hpcsched check``: a preflight for admins, one line per check (``ok``, ``warn`` or ``FAIL``).

Facts are gathered by thin functions that call Slurm or look at the file system
(:func:`gather_slurm`, :func:`gather_control_dir`, :func:`gather_store`); every check is a pure
function of them, so tests feed fake facts. ``hpcsched check`` exits 1 when a check FAILs, else 0.
It neither creates nor migrates anything (opening an existing SQLite store does take group and
other access off it, as every opener of the store does). The daemon runs one check at start
(:func:`start_refusal`): a configured partition that Slurm does not have stops it, status 2.

The texts of ``scontrol -a -o show partition``, ``scontrol show config`` and ``sacctmgr -n -P``
are parsed here, following the man pages named in each docstring (scontrol(1), sacctmgr(1),
slurm.conf(5)); ``tests/test_preflight.py`` holds what the dev cluster's 22.05.8 printed.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from hpcsched.daemon.config import DEFAULT_PATH, ConfigError, DaemonSettings, Settings, load
from hpcsched.daemon.site_limits import read_site_limits
from hpcsched.policies import POLICIES, PolicyError
from hpcsched.protocol.kinds import GrowMode
from hpcsched.slurm.commands import run
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable
from hpcsched.slurm.hostlist import expand_hostlist
from hpcsched.slurm.observe import slurm_version

log = logging.getLogger("hpcsched.daemon")

OK, WARN, FAIL = "ok", "warn", "FAIL"
OLDEST, NEWEST = (22, 5), (26, 5)   # the Slurm releases hpcsched reads (docs/slurm-versions.md)
_UNSET = ("", "(null)", "none", "n/a")
_DOC = "; docs/slurm-plugins.md"


@dataclass(frozen=True)
class Result:
    status: str   # OK, WARN or FAIL
    name: str
    text: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<13} {self.text}"


@dataclass(frozen=True)
class SlurmFacts:
    """What Slurm said; None where it could not be read (``errors[what]`` says why)."""
    version: tuple[int, int] | None = None                      # sinfo --version
    partitions: Mapping[str, Mapping[str, str]] | None = None   # name -> scontrol's fields
    config: Mapping[str, str] | None = None                     # scontrol show config
    job_limits: tuple[tuple[str, int], ...] | None = None       # (which limit, jobs per user)
    errors: Mapping[str, str] = field(default_factory=dict)
    extension_qos: str | None = None    # the job_submit plugin's extension_qos (site_limits)
    qos: Mapping[str, Mapping[str, str]] | None = None          # name -> Preempt, GraceTime...
    submit_stamp: str | None = None     # the job_submit plugin's submit_stamp (site_limits)


@dataclass(frozen=True)
class DirFacts:
    path: Path
    exists: bool = False
    is_dir: bool = False
    mode: int = 0   # permission bits and the sticky bit (stat.S_IMODE)


@dataclass(frozen=True)
class StoreFacts:
    url: str                        # password hidden
    current: str | None = None
    head: str | None = None
    known: tuple[str, ...] = ()     # every revision of this hpcsched's migrations
    missing: bool = False           # a SQLite file not created yet
    not_writable: str = ""          # why it cannot be written ("" when it can or was not tested)
    tested_write: bool = True       # False: not SQLite, writability not tested
    error: str = ""


# -- Slurm's texts (pure) -------------------------------------------------------------------------

def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol -a -o show partition`` (scontrol(1)): one ``Key=Value ...`` line per partition."""
    parts = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if fields.get("PartitionName"):
            parts[fields["PartitionName"]] = fields
    return parts


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (scontrol(1)): ``Key = Value`` lines; the first of a key wins."""
    conf: dict[str, str] = {}
    for m in re.finditer(r"^(\w+)\s*=\s*(.*?)\s*$", text, re.MULTILINE):
        conf.setdefault(m.group(1), m.group(2))
    return conf


def parse_limits(qos: str, assoc: str) -> tuple[tuple[str, int], ...]:
    """Per-user job limits (sacctmgr(1), ``-n -P``): ``show qos format=Name,MaxJobsPU,
    MaxSubmitJobsPU`` and ``show assoc format=Account,User,MaxJobs,MaxSubmitJobs``; unset is ''."""
    found: list[tuple[str, int]] = []
    for line in filter(str.strip, qos.splitlines()):
        name, *vals = line.split("|")
        found += _limits(f"QOS {name}", ("MaxJobsPerUser", "MaxSubmitJobsPerUser"), vals)
    for line in filter(str.strip, assoc.splitlines()):
        acct, user, *vals = (line.split("|") + ["", "", ""])[:4]
        who = f"user {user} (account {acct})" if user else f"account {acct}"
        found += _limits(who, ("MaxJobs", "MaxSubmitJobs"), vals)
    return tuple(found)


def parse_qos(text: str) -> dict[str, dict[str, str]]:
    """sacctmgr(1) ``-n -P show qos format=Name,Preempt,PreemptMode,GraceTime``: name ->
    those fields (``Preempt`` a comma-separated list, ``GraceTime`` ``[D-]HH:MM:SS``)."""
    out: dict[str, dict[str, str]] = {}
    for line in filter(str.strip, text.splitlines()):
        name, preempt, mode, grace = (line.split("|") + ["", "", ""])[:4]
        out[name] = {"Preempt": preempt, "PreemptMode": mode, "GraceTime": grace}
    return out


def _seconds(hms: str) -> int:
    """``[D-]HH:MM:SS`` (sacctmgr's GraceTime) in seconds; 0 for anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", hms.strip())
    if not m:
        return 0
    d, h, mi, sec = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + sec


def _limits(who: str, keys: Sequence[str], values: Sequence[str]) -> list[tuple[str, int]]:
    return [(f"{who} {k}={v}", int(v)) for k, v in zip(keys, values) if v.strip().isdigit()]


def enforces_limits(config: Mapping[str, str]) -> bool:
    """slurm.conf(5) AccountingStorageEnforce: limits, qos, safe or all apply association and QOS
    limits; associations alone does not."""
    words = config.get("AccountingStorageEnforce", "").lower().replace(" ", "").split(",")
    return bool({"limits", "qos", "safe", "all"} & set(words))


# -- gathering: Slurm and the file system ----------------------------------------------------------

def read_partitions(timeout: float) -> dict[str, dict[str, str]]:
    """Every partition, hidden ones too (``scontrol -a -o show partition``). Raises SlurmError."""
    return parse_partitions(run(["scontrol", "-a", "-o", "show", "partition"], timeout=timeout))


def gather_slurm(d: DaemonSettings) -> SlurmFacts:
    """Version, partitions, configuration, and (with ``grow = extension`` where slurm.conf
    enforces limits) the per-user job limits. A controller that does not answer is asked only
    once: each further question would wait ``MessageTimeout`` (slurm.conf(5)) again."""
    t, errors, down = d.slurm_timeout, {}, set()

    def ask(what: str, call: Callable[[], object]):
        try:
            return call()
        except SlurmError as exc:
            errors[what] = _short(exc)
            if isinstance(exc, SlurmUnavailable):
                down.add(what)

    version = ask("version", lambda: slurm_version(timeout=t))
    partitions = ask("partitions", lambda: read_partitions(t))
    if "partitions" in down:
        return SlurmFacts(version=version, errors={**errors, "config": "Slurm does not answer"})
    config = ask("config", lambda: parse_config(run(["scontrol", "show", "config"], timeout=t)))
    limits = None
    if config is not None and d.grow == GrowMode.EXTENSION and enforces_limits(config):
        sacctmgr = ["sacctmgr", "-n", "-P", "show"]
        limits = ask("limits", lambda: parse_limits(
            run([*sacctmgr, "qos", "format=Name,MaxJobsPU,MaxSubmitJobsPU"], timeout=t),
            run([*sacctmgr, "assoc", "format=Account,User,MaxJobs,MaxSubmitJobs"], timeout=t)))
    site = read_site_limits(d.site_limits)
    lend = site.extension_qos
    qos = None
    if lend is not None and config is not None:
        qos = ask("qos", lambda: parse_qos(run(
            ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Preempt,PreemptMode,GraceTime"],
            timeout=t)))
    return SlurmFacts(version, partitions, config, limits, errors, lend, qos, site.submit_stamp)


def _short(exc: Exception) -> str:
    """``cmd args: line; line; last line`` -> ``cmd args: last line`` (Slurm's clients print
    their retries first and the reason last)."""
    cmd, _, lines = " ".join(str(exc).split()).partition(": ")
    return f"{cmd}: {lines.split('; ')[-1]}" if lines else cmd


def gather_control_dir(path: Path) -> DirFacts:
    try:
        st = path.stat()
    except OSError:
        return DirFacts(path)
    return DirFacts(path, True, stat.S_ISDIR(st.st_mode), stat.S_IMODE(st.st_mode))


def gather_store(url: str) -> StoreFacts:
    """The store's schema revision and the newest (Alembic, ``db/``); a SQLite file must be
    writable with its directory (SQLite writes its -wal and -shm files there)."""
    from alembic.script import ScriptDirectory

    from hpcsched.daemon.store import Store, alembic_config
    from hpcsched.daemon.store.schema import safe_url, sqlite_file

    shown = safe_url(url)
    try:
        script = ScriptDirectory.from_config(alembic_config(url))
        head, known = script.get_current_head(), tuple(r.revision for r in script.walk_revisions())
    except Exception as exc:  # noqa: BLE001 - one line for the admin
        return StoreFacts(shown, error=f"migrations not found: {exc}")
    file, why = sqlite_file(url), ""
    if file is not None:
        where = file if file.exists() else next(p for p in file.parents if p.exists())
        bad = [str(p) for p in dict.fromkeys((where, file.parent))
               if p.exists() and not os.access(p, os.W_OK)]
        why = f"{', '.join(bad)} not writable by uid {os.geteuid()}" if bad else ""
        if where != file:   # opening it would create it
            return StoreFacts(shown, head=head, known=known, missing=True, not_writable=why)
    try:
        with Store(url) as store:
            current = store.current_revision()
    except Exception as exc:  # noqa: BLE001
        return StoreFacts(shown, head=head, known=known, error=" ".join(str(exc).split())[:200])
    return StoreFacts(shown, current, head, known, not_writable=why, tested_write=file is not None)


# -- the checks (pure) -----------------------------------------------------------------------------

def check_config(settings: Settings) -> Result:
    """The daemon's loader (:func:`hpcsched.daemon.config.load`) accepted the file."""
    return Result(OK, "config", f"{settings.path or 'no file: every setting at its default'} "
                  f"(policy {settings.policy.name}, partitions "
                  f"{', '.join(settings.daemon.partitions) or 'all'})")


def check_partitions(wanted: Sequence[str], partitions: Mapping[str, Mapping[str, str]] | None,
                     error: str | None, where: object = "the configuration") -> Result:
    """Every ``[daemon] partitions`` entry is a Slurm partition, and up (scontrol(1))."""
    if partitions is None:
        return Result(FAIL, "partitions", f"Slurm does not answer ({error}); start slurmctld, or "
                      "point SLURM_CONF at the cluster's slurm.conf")
    if not wanted:
        return Result(OK, "partitions", f"[] manages every partition ({len(partitions)} in Slurm)")
    missing = [p for p in wanted if p not in partitions]
    if missing:
        return Result(FAIL, "partitions", f"{', '.join(missing)}: not a Slurm partition (Slurm "
                      f"has: {', '.join(partitions) or 'none'}); fix [daemon] partitions in {where}")
    down = [f"{p} State={partitions[p]['State']}" for p in wanted
            if partitions[p].get("State", "UP") != "UP"]
    if down:
        return Result(WARN, "partitions", f"{', '.join(down)}: Slurm starts no job there; "
                      "scontrol update PartitionName=NAME State=UP")
    return Result(OK, "partitions", f"{', '.join(wanted)}: in Slurm, State=UP")


def control_dir_unset(settings: Settings, env=None) -> str | None:
    """Why the daemon may watch the wrong directory: neither ``[daemon] control_dir`` nor
    ``$HPCSCHED_CONTROL_DIR`` is set, so it reads its own user's ``~/.hpcsched/jobs`` while
    every other user's hpcsub writes to theirs; None when one of them is set."""
    env = os.environ if env is None else env
    if settings.daemon.control_dir or env.get("HPCSCHED_CONTROL_DIR"):
        return None
    return (f"[daemon] control_dir is not set: the daemon reads {settings.control_dir_path()}, "
            "its own user's, and sees no other user's job; set it, and HPCSCHED_CONTROL_DIR for "
            "the users (e.g. in /etc/profile.d), to one directory the compute nodes share")


def check_control_dir(f: DirFacts, unset: str | None = None) -> Result:
    """The job directories' root is configured (``unset``: :func:`control_dir_unset`'s
    warning), exists, is a directory and has mode 1777 (world-writable and sticky: README,
    Environment). That the compute nodes share it is not checked."""
    fix = f"install -d -m 1777 {f.path} (on the file system the compute nodes share)"
    if unset:
        return Result(WARN, "control-dir", unset)
    if not f.exists:
        return Result(WARN, "control-dir", f"{f.path} does not exist; {fix}")
    if not f.is_dir:
        return Result(FAIL, "control-dir", f"{f.path} is not a directory; remove it, then {fix}")
    if f.mode & 0o1777 != 0o1777:   # setgid and the like may come on top
        return Result(WARN, "control-dir", f"{f.path} is mode {f.mode:04o}, not 1777 (world-"
                      f"writable, sticky): other users' jobs cannot use it; chmod 1777 {f.path}")
    return Result(OK, "control-dir", f"{f.path}: a directory, mode 1777")


def check_version(version: tuple[int, int] | None, error: str | None) -> Result:
    """``sinfo --version`` (sinfo(1)) is 22.05 to 26.05, the releases hpcsched reads."""
    if version is None:
        return Result(FAIL, "slurm-version", f"unknown ({error})")
    shown = f"Slurm {version[0]}.{version[1]:02d}"
    if version < OLDEST:
        return Result(FAIL, "slurm-version", f"{shown} is older than 22.05, the oldest hpcsched "
                      "reads; upgrade Slurm")
    if version > NEWEST:
        return Result(WARN, "slurm-version", f"{shown} is newer than 26.05, the newest hpcsched "
                      "was tested with (docs/slurm-versions.md)")
    return Result(OK, "slurm-version", f"{shown} (supported: 22.05 to 26.05)")


def check_plugins(config: Mapping[str, str] | None, error: str | None) -> list[Result]:
    """The optional Slurm-side plugins (docs/slurm-plugins.md), from slurm.conf(5)'s
    JobSubmitPlugins, Prolog, PrologFlags and Epilog as ``scontrol show config`` shows them:
    ok when wired, warn when not (never FAIL). Which job_submit.lua the lua plugin runs, and
    what the Prolog and Epilog scripts run, is not checked."""
    if config is None:
        return [Result(WARN, "plugins", f"not checked ({error})")]
    get = {k: v for k, v in config.items() if v.lower() not in _UNSET}.get
    subs = get("JobSubmitPlugins", "")
    if "lua" not in subs.split(","):
        sub = Result(WARN, "job_submit", f"JobSubmitPlugins={subs or '(none)'}: hpcsched's "
                     f"job_submit.lua is not wired (hpcsub jobs are neither tagged nor limited){_DOC}")
    else:
        sub = Result(OK, "job_submit", "JobSubmitPlugins=lua")
    pro, flags, epi = get("Prolog"), get("PrologFlags", ""), get("Epilog")
    prolog = (Result(WARN, "prolog", f"no Prolog: GPUs are not probed at job start{_DOC}") if not pro
              else Result(WARN, "prolog", f"Prolog={pro} without PrologFlags=Alloc: the probe runs "
                          f"at a job's first step, beside the job{_DOC}") if "alloc" not in flags.lower()
              else Result(OK, "prolog", f"Prolog={pro}, PrologFlags={flags}"))
    epilog = (Result(OK, "epilog", f"Epilog={epi}") if epi else
              Result(WARN, "epilog", f"no Epilog: dcgm-exporter's job mapping is not cleared{_DOC}"))
    return [sub, prolog, epilog]


def check_extensions(d: DaemonSettings, config: Mapping[str, str] | None,
                     limits: Sequence[tuple[str, int]] | None, errors: Mapping[str, str]) -> Result:
    """Extension jobs (docs/extensions.md) may run: slurm.conf(5)'s AccountingStorageEnforce,
    then sacctmgr(1)'s per-user job limits (a user held to 1 job cannot add one), and other
    JobSubmitPlugins than lua (not checked: warn). Warns whenever it cannot tell."""
    if d.grow != GrowMode.EXTENSION:
        return Result(OK, "extensions", f"grow = {d.grow}: no extension jobs (plans of whole nodes)")
    need = f"granularity {d.plan_granularity}, grow = extension"
    if config is None:
        return Result(WARN, "extensions", f"{need}: unknown whether Slurm allows them "
                      f"({errors.get('config')})")
    others = [p for p in config.get("JobSubmitPlugins", "").split(",")
              if p.strip().lower() not in ("lua", *_UNSET)]
    note = f"; JobSubmitPlugins={','.join(others)} may refuse them (not checked)" if others else ""
    enforce = config.get("AccountingStorageEnforce", "none")
    if not enforces_limits(config):
        return Result(WARN if others else OK, "extensions",
                      f"{need}: AccountingStorageEnforce={enforce} enforces no job limits{note}")
    if limits is None:
        return Result(WARN, "extensions", f"{need}: AccountingStorageEnforce={enforce}, but the "
                      f"job limits cannot be read ({errors.get('limits')}); a user held to 1 job "
                      "cannot grow by extension")
    blocking = [w for w, n in limits if n <= 1]
    if blocking:
        return Result(WARN, "extensions", f"{need}: {'; '.join(blocking[:3])}: those jobs cannot "
                      "grow by extension; raise the limit, or set [daemon] grow = \"requeue\"")
    least = min(limits, key=lambda x: x[1], default=None)
    return Result(WARN if others else OK, "extensions", f"{need}: no per-user job limit below 2"
                  + (f" (least: {least[0]})" if least else "") + note)


def check_lending(d: DaemonSettings, s: SlurmFacts) -> Result:
    """Lent GPUs go back at once when extension jobs are preemptible (``docs/daemon.md``,
    "Sharing the cluster"): the job_submit plugin's ``extension_qos`` names a QOS that exists,
    slurm.conf(5) has ``PreemptType=preempt/qos``, another QOS lists it in ``Preempt``
    (sacctmgr(1)), and its ``GraceTime`` leaves the workers time to leave at a step boundary
    (0: Slurm kills them at once, and the step in flight is voided). Without ``extension_qos``
    the daemon gives lent GPUs back itself: within a second of another user's submission when
    it watches the plugin's ``submit_stamp`` (ok), else at its next look (warn)."""
    if d.grow != GrowMode.EXTENSION:
        return Result(OK, "lending", f"grow = {d.grow}: no GPUs lent by extension")
    if s.extension_qos is None:
        return _lending_by_the_daemon(d, s.submit_stamp)
    q = s.extension_qos
    if s.config is None or s.qos is None:
        return Result(WARN, "lending", f"extension_qos = {q}: not checked "
                      f"({s.errors.get('qos') or s.errors.get('config')})")
    ptype = s.config.get("PreemptType", "preempt/none")
    if ptype != "preempt/qos":
        return Result(FAIL, "lending", f"extension_qos = {q}, but PreemptType={ptype}: Slurm "
                      "preempts no extension job; set PreemptType=preempt/qos in slurm.conf")
    if q not in s.qos:
        return Result(FAIL, "lending", f"extension_qos = {q}: no such QOS (sacctmgr add qos {q}); "
                      "every extension job would be refused")
    by = sorted(n for n, f in s.qos.items() if q in f["Preempt"].split(","))
    if not by:
        return Result(FAIL, "lending", f"QOS {q}: no QOS preempts it; e.g. sacctmgr modify qos "
                      f"normal set Preempt+={q}")
    grace = _seconds(s.qos[q]["GraceTime"])
    if grace <= 0:
        return Result(WARN, "lending", f"QOS {q}: GraceTime 0: Slurm kills preempted extension "
                      "workers at once (the step in flight is voided); give it a few steps' time, "
                      f"e.g. sacctmgr modify qos {q} set GraceTime=60")
    return Result(OK, "lending", f"extension jobs in QOS {q}, preempted by {', '.join(by)} "
                  f"(GraceTime {grace} s)")


def _lending_by_the_daemon(d: DaemonSettings, plugin_stamp: str | None) -> Result:
    """:func:`check_lending` without ``extension_qos``: how soon the daemon hears of another
    user's submission (``[daemon] submit_stamp`` and the plugin's ``submit_stamp``)."""
    if d.submit_stamp and plugin_stamp and d.submit_stamp != plugin_stamp:
        return Result(FAIL, "lending", f"[daemon] submit_stamp = {d.submit_stamp}, but the "
                      f"job_submit plugin stamps {plugin_stamp}: the daemon would never see it "
                      'change; set it to the same path, or to "" to take the plugin\'s')
    if plugin_stamp:
        return Result(OK, "lending", f"no extension_qos: lent GPUs go back at the daemon's look "
                      f"within a second of another user's submission (submit_stamp {plugin_stamp})")
    if d.submit_stamp:
        return Result(WARN, "lending", f"[daemon] submit_stamp = {d.submit_stamp}, but "
                      "job_submit_hpcsched.conf here sets no submit_stamp: unless the plugin's "
                      "settings on the controller do, the file never changes")
    return Result(WARN, "lending", "no extension_qos nor submit_stamp in "
                  "job_submit_hpcsched.conf: lent GPUs go back to other users' jobs at the "
                  "daemon's next look (up to event_poll s), not at once; see docs/daemon.md, "
                  "\"Sharing the cluster\"")


def check_partition_policies(settings: Settings, partitions: Mapping[str, Mapping[str, str]] | None
                             ) -> Result | None:
    """``[policy.partitions.*]`` (docs/configuration.md): partitions planned by different
    policies share no node (scontrol(1)'s ``Nodes=``). None when no partition has its own."""
    own = settings.policy.for_partitions()
    if not own:
        return None
    if partitions is None:
        return Result(WARN, "policies", "per-partition policies: partitions' nodes unknown")
    policy_of = {p: own.get(p, (settings.policy.name, None))[0] for p in settings.daemon.partitions}
    by_node: dict[str, str] = {}
    for p in settings.daemon.partitions:
        group = f"[policy.partitions.{p}]" if p in own else "[policy]"
        for n in expand_hostlist(partitions.get(p, {}).get("Nodes", "")):
            other = by_node.setdefault(n, group)
            if other != group:
                return Result(FAIL, "policies", f"node {n} is in partitions planned by {other} and "
                              f"{group}: give them the same policy or disjoint nodes")
    return Result(OK, "policies", ", ".join(f"{p}: {policy_of[p]}" for p in settings.daemon.partitions))


def check_store(f: StoreFacts) -> Result:
    """The store is writable and at this hpcsched's newest Alembic revision; an older one is a
    warning (the daemon migrates it at start), one this hpcsched does not know a failure."""
    upgrade = "hpcsched db upgrade (the daemon also does it at start)"
    if f.error:
        return Result(FAIL, "store", f"{f.url}: {f.error}")
    if f.not_writable:
        return Result(FAIL, "store", f"{f.url}: {f.not_writable}; run as the daemon's user")
    if f.missing:
        return Result(WARN, "store", f"{f.url}: no database yet (newest revision {f.head}); {upgrade}")
    if f.current is None or (f.current != f.head and f.current in f.known):
        return Result(WARN, "store", f"{f.url}: revision {f.current or 'none'}, newest {f.head}; {upgrade}")
    if f.current != f.head:
        return Result(FAIL, "store", f"{f.url}: revision {f.current} is unknown to this hpcsched "
                      f"(newest {f.head}): a newer hpcsched migrated it")
    return Result(OK, "store", f"{f.url}: revision {f.head} (newest)" + (
        ", writable" if f.tested_write else "; writability not tested (not SQLite)"))


def run_checks(settings: Settings, s: SlurmFacts, cdir: DirFacts, store: StoreFacts) -> list[Result]:
    d = settings.daemon
    return [check_config(settings),
            check_partitions(d.partitions, s.partitions, s.errors.get("partitions"),
                             settings.path or DEFAULT_PATH),
            check_control_dir(cdir, control_dir_unset(settings)),
            check_version(s.version, s.errors.get("version")),
            *check_plugins(s.config, s.errors.get("config")),
            check_store(store),
            check_extensions(d, s.config, s.job_limits, s.errors),
            check_lending(d, s),
            *filter(None, [check_partition_policies(settings, s.partitions)])]


def start_refusal(settings: Settings) -> str | None:
    """At daemon start: the line to refuse with when a ``[daemon] partitions`` entry is not a
    Slurm partition; None when all are, none is configured, or Slurm does not answer (logged:
    the rounds retry as before)."""
    d = settings.daemon
    if not d.partitions:
        return None
    try:
        partitions = read_partitions(d.slurm_timeout)
    except SlurmError as exc:
        log.warning("partitions not checked at start (Slurm: %s); the rounds will retry", exc)
        return None
    r = check_partitions(d.partitions, partitions, None, settings.path or DEFAULT_PATH)
    return f"Error: {r.text}" if r.status == FAIL else None


@click.command("check")
@click.option("--config", type=click.Path(dir_okay=False), default=None,
              help="TOML file (default: $HPCSCHED_CONFIG or /etc/hpcsched/hpcsched.toml).")
def check_command(config):
    """Preflight for admins: configuration, partitions, control directory, Slurm version and
    plugins, store, extension jobs and their lending. One line per check; exit status 1 when one FAILs."""
    try:
        settings = load(config, policy_names=POLICIES)
    except (ConfigError, PolicyError) as exc:
        click.echo(Result(FAIL, "config", f"{exc}; fix the file").line())
        raise SystemExit(1) from None
    results = run_checks(settings, gather_slurm(settings.daemon),
                         gather_control_dir(settings.control_dir_path()),
                         gather_store(settings.daemon.database_url))
    for r in results:
        click.echo(r.line())
    raise SystemExit(1 if any(r.status == FAIL for r in results) else 0)
