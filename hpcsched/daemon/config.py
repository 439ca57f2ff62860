"""The daemon's settings: one TOML file, parsed into frozen, typed dataclasses.

Where the file is, first match wins:

1. the path given to :func:`load` (the daemon's ``--config``): it must exist;
2. ``$HPCSCHED_CONFIG``: it must exist;
3. :data:`DEFAULT_PATH` (``/etc/hpcsched/hpcsched.toml``): when it does not exist, every
   setting has its default.

``$HPCSCHED_DATABASE_URL`` overrides ``[daemon] database_url`` whichever file was read.

Every mistake in the file is a :class:`ConfigError` (a ``ValueError``) whose one-line message
starts with the file's path: an unknown key (the message lists the valid keys of that table),
a value of the wrong type or out of range (the message names the table, the key and what was
expected), or a file that is not TOML. ``[policy.params]`` is free-form: the policy validates it.

:func:`example_toml` renders a fully commented file holding every default; it is generated from
the same field table that validates, so docs and code cannot drift apart
(``docs/configuration.md`` shows it).
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hpcsched.model.snapshot import EXTENSION_STALL, EXTENSION_STARTUP, GRANULARITIES, GROW_MODES
from hpcsched.perf.shared import THROUGHPUT_MODELS
from hpcsched.policies import DEFAULT_POLICY, POLICIES, PolicyError, make_policy
from hpcsched.protocol.kinds import Granularity, GrowMode

DEFAULT_PATH = Path("/etc/hpcsched/hpcsched.toml")
ENV_CONFIG = "HPCSCHED_CONFIG"
ENV_DATABASE_URL = "HPCSCHED_DATABASE_URL"

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """The configuration is unusable; the message is one line and starts with the file's path."""


# -- value checks: each returns the converted value or raises _Bad(what was expected) ----------


class _Bad(Exception):
    def __init__(self, expected: str):
        super().__init__(expected)
        self.expected = expected


def _number(*, gt: float | None = None, ge: float | None = None) -> Callable[[Any], float]:
    expected = "a number" + (f" > {gt:g}" if gt is not None else "") + (
        f" >= {ge:g}" if ge is not None else "")

    def check(v: Any) -> float:
        # bool is an int in Python but never a number in a config file
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(expected)
        v = float(v)
        if math.isnan(v) or math.isinf(v):
            raise _Bad(expected)
        if (gt is not None and not v > gt) or (ge is not None and not v >= ge):
            raise _Bad(expected)
        return v

    return check


def _integer(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad("an integer")
    return v


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _Bad("an integer >= 0")
    return v


def _positive_integer(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _Bad("an integer >= 1")
    return v


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("a boolean (true or false)")
    return v


def _port(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
        raise _Bad("a TCP port, an integer 0..65535")
    return v


def _string(*, nonempty: bool = False) -> Callable[[Any], str]:
    expected = "a non-empty string" if nonempty else "a string"

    def check(v: Any) -> str:
        if not isinstance(v, str) or (nonempty and not v.strip()):
            raise _Bad(expected)
        return v

    return check


def _string_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise _Bad("a list of non-empty strings")
    return tuple(v)


def _choice(*choices: str) -> Callable[[Any], str]:
    expected = "one of " + "|".join(choices)

    def check(v: Any) -> str:
        if not isinstance(v, str) or v.lower() not in choices:
            raise _Bad(expected)
        return choices[choices.index(v.lower())]   # the choice itself: an enum's member

    return check


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def _database_url(v: Any) -> str:
    if not isinstance(v, str) or not _URL.match(v):
        raise _Bad("an SQLAlchemy URL (dialect[+driver]://...)")
    return v


def _table(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise _Bad("a table")
    return _freeze(v)


def _freeze(v: Any) -> Any:
    """Deep-immutable copy of a TOML value: tables become read-only mappings, arrays tuples."""
    if isinstance(v, dict):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _opt(default: Any, check: Callable[[Any], Any], help: str, *, factory: bool = False):
    """A settings field: its default, its check, and the comment :func:`example_toml` writes."""
    meta = {"check": check, "help": help}
    if factory:
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


# -- the settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonSettings:
    """``[daemon]``: how the round loop runs. Times in seconds; ``min_gain`` a fraction."""

    round_interval: float = _opt(60.0, _number(gt=0), "seconds between scheduling rounds (> 0)")
    partitions: tuple[str, ...] = _opt(
        ("gpu",), _string_list,
        "Slurm partitions whose hpcsched jobs the daemon manages; [] = all partitions")
    control_dir: str = _opt(
        "", _string(),
        'job directories; "" = $HPCSCHED_CONTROL_DIR, else ~/.hpcsched/jobs '
        "(must be on the file system the compute nodes share)")
    database_url: str = _opt(
        "sqlite:////var/lib/hpcsched/hpcsched.db", _database_url,
        "any SQLAlchemy URL; a SQLite file must be on a local disk, not NFS "
        "(env HPCSCHED_DATABASE_URL overrides)")
    dry_run: bool = _opt(False, _boolean, "decide and record every round, but never act")
    restart_cost: float = _opt(
        30.0, _number(ge=0),
        "seconds a grow (requeue and relaunch) costs a job until 3 grows have been measured "
        "here; then the median of the latest 20 (>= 0)")
    shrink_cost: float = _opt(2.0, _number(ge=0),
                              "seconds an in-place shrink costs until 3 have been measured here; "
                              "then the median of the latest 20 (>= 0)")
    grow: GrowMode = _opt(
        GrowMode.EXTENSION, _choice(*GROW_MODES),
        "how a running job grows: " + "|".join(GROW_MODES) + "; extension: extension Slurm "
        "jobs whose workers join it, no restart (docs/extensions.md); requeue: checkpoint, "
        "requeue, restart at the new size (priced at restart_cost)")
    granularity: Granularity = _opt(
        Granularity.AUTO, _choice(*Granularity),
        "what the policy's plans may ask for: auto|" + "|".join(GRANULARITIES) + "; gpu: any "
        "number of GPUs on any GPUs per node (4 + 2), realised with extension jobs, so it needs "
        "grow = extension; node: whole nodes x the job's GPUs per node (for sites that forbid "
        "extension jobs); auto: gpu with grow = extension, else node")
    extension_startup: float = _opt(
        EXTENSION_STARTUP, _number(ge=0),
        "with grow = extension: seconds the new workers take to start while the job trains on "
        "at its old size, until 3 grows by extension have been measured here; then the median "
        "of the latest 20 (>= 0)")
    extension_stall: float = _opt(
        EXTENSION_STALL, _number(ge=0),
        "with grow = extension: seconds every rank stalls while the group re-forms and the new "
        "workers receive the state (benchmarks/resize_latency.py measures it; >= 0)")
    throughput_model: str = _opt(
        "shared", _choice(*THROUGHPUT_MODELS),
        "how the policies predict a job's step times: " + "|".join(THROUGHPUT_MODELS) +
        "; shared: the application's prior corrected by what all its jobs measured here "
        "(jobs with the same --hpcsched-application must train the same model); fitted: "
        "Pollux's model fitted to each job's own measurements")
    min_gain: float = _opt(
        0.05, _number(ge=0),
        "a change must improve predicted throughput by at least this fraction of the "
        "managed jobs' total (>= 0)")
    horizon: float = _opt(
        600.0, _number(gt=0),
        "seconds over which a resize's predicted gain is weighed against its restart cost (> 0)")
    hold_rounds: int = _opt(
        3, _integer,
        "no thrash: a job resized fewer than this many rounds ago is not resized back the "
        "other way (0 = off)")
    keep_free_gpus: int = _opt(
        0, _count,
        "GPUs no grow takes, kept free (on as few nodes as hold them) for other users' jobs "
        "not yet submitted, so that one of up to that many GPUs starts at once rather than "
        "after lent GPUs come back (up to a step of the lender); lent GPUs are released to "
        "keep them free; per group of partitions planned together (docs/daemon.md, Sharing "
        "the cluster; >= 0, 0 = off)")
    lock_file: str = _opt("/run/hpcsched/daemon.lock", _string(nonempty=True),
                          "held by the running daemon: one daemon per cluster")
    log_level: str = _opt("info", _choice(*LOG_LEVELS), "daemon log level: " + "|".join(LOG_LEVELS))
    slurm_timeout: float = _opt(20.0, _number(gt=0), "seconds allowed per Slurm command (> 0)")
    ack_timeout: float = _opt(
        180.0, _number(gt=0),
        "seconds to wait for a job to acknowledge a control change (> 0)")
    step_wait: float = _opt(
        1.0, _number(gt=0),
        "seconds a round (or an actuation tick) waits in all for its resize steps -- control "
        "files written, Slurm commands for them; a step still under way then (a file system "
        "that stalls, a slow slurmctld) goes on in its own thread, its job left alone, and the "
        "next round or tick journals it (> 0)")
    actuation_interval: float = _opt(
        1.0, _number(gt=0),
        "seconds between steps of resizes in flight, between rounds (one Slurm observation "
        "each, only while a resize is open; > 0)")
    event_rounds: bool = _opt(
        True, _boolean,
        "for a policy that asks for them (jct): also run a round as soon as a managed job ends "
        "or a newly submitted one is pending, besides every round_interval seconds (false: "
        "every round_interval only)")
    event_poll: float = _opt(
        10.0, _number(gt=0),
        "seconds between the daemon's checks for job ends and submissions between rounds (one "
        "Slurm observation each, only with event_rounds and a policy that asks; > 0)")
    submit_stamp: str = _opt(
        "", _string(),
        "a file hpcsched's job_submit plugin rewrites at every submission that is not "
        "hpcsched's (its own submit_stamp setting, docs/slurm-plugins.md); between rounds the "
        "daemon looks at Slurm as soon as it changes, at most once a second, instead of at its "
        'next event_poll ("" = the plugin\'s own, read from site_limits, if it sets one; only '
        "with event_rounds and a policy that asks)")
    preemption_deadline: float = _opt(
        1800.0, _number(gt=0),
        "seconds a job preempted by the policy stays held at most: the daemon requeues it with "
        "StartTime=now+<this>, so Slurm itself starts it then even if no daemon runs; a plan "
        "that gives it GPUs releases it earlier (> 0)")
    metrics_port: int = _opt(
        0, _port,
        "TCP port of the Prometheus metrics endpoint (/metrics; docs/metrics.md); 0 = off")
    metrics_addr: str = _opt(
        "127.0.0.1", _string(nonempty=True),
        "address the metrics endpoint listens on; the default keeps it to this host (it has no "
        "authentication and names jobs and nodes): set the host's address for a remote "
        "Prometheus, behind a firewall")
    exclude_users: tuple[str, ...] = _opt(
        (), _string_list,
        "Slurm users whose jobs hpcsched never manages: their hpcsub jobs run as submitted, "
        "counted as other users' jobs (yielded to while pending)")
    exclude_accounts: tuple[str, ...] = _opt(
        (), _string_list, "Slurm accounts (-A) whose jobs hpcsched never manages, as exclude_users")
    exclude_qos: tuple[str, ...] = _opt(
        (), _string_list, "QOS names (--qos) whose jobs hpcsched never manages, as exclude_users")
    lease_seconds: float = _opt(
        120.0, _number(gt=0),
        "one daemon per cluster: the daemon that holds the store's lease runs the rounds and "
        "renews it every round and actuation tick; any other daemon on the same store stands "
        "by and takes over this many seconds after the holder's last renewal (a clean stop "
        "hands it over at once); more than the longest round")
    site_limits: str = _opt(
        "", _string(),
        "the site's limits on elastic jobs that the daemon enforces itself: the job_submit "
        "plugin's settings file (max_gpus = N, partition.<name>.max_gpus = N; "
        "slurm-plugins/job_submit.lua); \"\" = job_submit_hpcsched.conf beside slurm.conf. A "
        "missing file is no limit")
    admin_group: str = _opt(
        "hpcsched-admin", _string(),
        "Unix group whose members, besides root, see and resize every user's jobs with hpcsched "
        "status and hpcsched resize (membership from the system's group database); those "
        f"commands read it from {DEFAULT_PATH} only, never from $HPCSCHED_CONFIG or the "
        'environment; "" = none (root only)')


    @property
    def plan_granularity(self) -> Granularity:
        """What plans may ask for here (``granularity``, its ``auto`` resolved): ``"gpu"``
        with ``grow = extension``, else ``"node"``."""
        if self.granularity != Granularity.AUTO:
            return self.granularity
        return Granularity.GPU if self.grow == GrowMode.EXTENSION else Granularity.NODE


@dataclass(frozen=True)
class ProbeSettings:
    """``[probe]``: the GPU probes the Slurm prolog writes (docs/slurm-plugins.md), which the
    daemon ingests every round, and what it does about a slow GPU. ``slow_fraction`` is a
    fraction of the peers' median score."""

    spool_dir: str = _opt(
        "/var/lib/hpcsched/gpu-probes", _string(),
        "directory the prolog (slurm-plugins/prolog-gpu-probe) writes GPU probes into and the "
        "daemon ingests every round (its HPCSCHED_PROBE_DIR); on a cluster, a directory the "
        "compute nodes share, owned by the daemon's user; \"\" = do not ingest")
    slow_fraction: float = _opt(
        0.8, _number(gt=0),
        "a GPU whose latest probe scores below this fraction of the median of its peers' "
        "latest probes (same kind and model) is reported slow (> 0)")
    min_peers: int = _opt(
        2, _positive_integer, "peers (other GPUs of the same kind and model) a GPU needs before it can be "
        "judged slow (>= 1)")
    drain_slow: bool = _opt(
        False, _boolean,
        "drain the node of a GPU found slow (scontrol update State=DRAIN with the reason); "
        "off: only reported (daemon log, hpcsched status --gpus)")


@dataclass(frozen=True)
class RetentionSettings:
    """``[retention]``: how long finished jobs are kept (days; 0 = for ever). The daemon removes
    what has expired about once an hour (:mod:`hpcsched.daemon.retention`)."""

    job_days: float = _opt(
        30.0, _number(ge=0),
        "days after a job finished that its job directory (spec, control files, metrics, and "
        "its checkpoints when they are in it) is removed; 0 = kept for ever")
    store_days: float = _opt(
        90.0, _number(ge=0),
        "days after a job finished that its rows in the store (profile, GPU measurements, "
        "journal) are removed, and rounds older than this; 0 = kept for ever")


@dataclass(frozen=True)
class PolicySettings:
    """``[policy]``: which policy decides, its random seed, and its own parameters.

    ``params`` is an immutable mapping (nested tables are immutable mappings too, arrays are
    tuples); the policy validates it, not this module.
    """

    name: str = _opt(DEFAULT_POLICY, _string(nonempty=True),
                     f"scheduling policy ({', '.join(POLICIES)})")
    seed: int = _opt(0, _integer, "seed for the policy's random choices")
    params: Mapping[str, Any] = _opt(
        lambda: MappingProxyType({}), _table,
        "free-form table of the policy's own parameters (checked by the policy)",
        factory=True)
    partitions: Mapping[str, Any] = _opt(
        lambda: MappingProxyType({}), _table,
        "a policy of its own for a partition: [policy.partitions.NAME] with name and params "
        "(NAME one of [daemon] partitions; partitions sharing nodes cannot differ); the other "
        "partitions use the policy above", factory=True)

    def for_partitions(self) -> dict[str, tuple[str, Mapping[str, Any]]]:
        """``{partition: (policy name, params)}`` of ``[policy.partitions.*]``."""
        return {p: (t["name"], t.get("params", MappingProxyType({})))
                for p, t in self.partitions.items()}


@dataclass(frozen=True)
class Settings:
    """Everything the daemon is configured with; ``path`` is the file read (None: defaults)."""

    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    path: Path | None = None

    def control_dir_path(self) -> Path:
        """The job directories: ``daemon.control_dir``, or :func:`hpcsched.protocol.jobdir.control_dir`
        (``$HPCSCHED_CONTROL_DIR`` or ``~/.hpcsched/jobs``) when it is empty."""
        if self.daemon.control_dir:
            return Path(self.daemon.control_dir).expanduser()
        from hpcsched.protocol.jobdir import control_dir

        return control_dir()


_TABLES: dict[str, type] = {"daemon": DaemonSettings, "probe": ProbeSettings,
                            "policy": PolicySettings, "retention": RetentionSettings}


def defaults() -> Settings:
    """The settings used when there is no file (``path`` is None)."""
    return Settings()


# -- loading ------------------------------------------------------------------------------------


def find_path(path: str | Path | None = None, *, env: Mapping[str, str] | None = None
              ) -> tuple[Path, bool]:
    """The file to read and whether it must exist (explicit path or ``$HPCSCHED_CONFIG``)."""
    env = os.environ if env is None else env
    if path is not None and str(path) != "":
        return Path(path).expanduser(), True
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser(), True
    return DEFAULT_PATH, False


def load(path: str | Path | None = None, *, env: Mapping[str, str] | None = None,
         policy_names: Collection[str] | None = None) -> Settings:
    """Read the daemon's settings (see the module docstring for the lookup order).

    ``env`` replaces ``os.environ`` for ``HPCSCHED_CONFIG`` and ``HPCSCHED_DATABASE_URL``
    (tests). When ``policy_names`` is given, ``[policy] name`` must be one of them, and a
    registered policy is made once with ``[policy.params]`` (a bad key or value is a one-line
    error listing the policy's keys). Raises :class:`ConfigError`.
    """
    env = os.environ if env is None else env
    file, required = find_path(path, env=env)
    where = str(file)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{where}: configuration file not found") from None
        data, file = {}, None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {_one_line(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {_one_line(exc)}") from None

    _unknown(where, "top level", data, [f"[{t}]" for t in _TABLES], list(_TABLES))
    parts = {}
    for table, cls in _TABLES.items():
        raw = data.get(table, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: [{table}] must be a table, got {_show(raw)}")
        parts[table] = _build(where, table, cls, raw)

    daemon: DaemonSettings = parts["daemon"]
    if env.get(ENV_DATABASE_URL):
        url = env[ENV_DATABASE_URL]
        try:
            _database_url(url)
        except _Bad as bad:
            raise ConfigError(f"{where}: ${ENV_DATABASE_URL} must be {bad.expected}, "
                              f"got {_show(url)}") from None
        daemon = replace(daemon, database_url=url)

    if daemon.granularity == Granularity.GPU and daemon.grow != GrowMode.EXTENSION:
        raise ConfigError(f"{where}: [daemon] granularity = \"gpu\" needs grow = \"extension\" "
                          "(a plan of any GPUs per node is realised with extension jobs); "
                          "set granularity = \"node\" or \"auto\"")
    policy: PolicySettings = parts["policy"]
    _check_policy(where, "[policy]", "[policy.params]:", policy.name, policy.params, policy_names)
    _check_partition_policies(where, policy, daemon, policy_names)
    return Settings(daemon=daemon, policy=policy, probe=parts["probe"],
                    retention=parts["retention"], path=file)


def _check_policy(where: str, table: str, params_what: str, name: str, params: Mapping[str, Any],
                  policy_names: Collection[str] | None) -> None:
    """With ``policy_names``: ``name`` is one of them, and a registered policy is made once with
    ``params`` (a bad key or value is a one-line error listing the policy's keys)."""
    if policy_names is None:
        return
    if name not in policy_names:
        raise ConfigError(f"{where}: {table} name: unknown policy {name!r}; "
                          f"known policies: {', '.join(sorted(policy_names)) or '(none)'}")
    if name in POLICIES:
        try:
            make_policy(name, params)
        except PolicyError as exc:
            raise ConfigError(f"{where}: {params_what} {exc}") from None


def _check_partition_policies(where: str, policy: PolicySettings, daemon: DaemonSettings,
                              policy_names: Collection[str] | None) -> None:
    """``[policy.partitions.NAME]``: NAME is a managed partition; a table of ``name`` (a known
    policy) and ``params`` (checked by that policy)."""
    for part, table in policy.partitions.items():
        what = f"[policy.partitions.{part}]"
        if part not in daemon.partitions:
            raise ConfigError(f"{where}: {what}: {part!r} is not one of [daemon] partitions "
                              f"({', '.join(daemon.partitions)})")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: {what} must be a table, got {_show(table)}")
        _unknown(where, what, dict(table), ["name", "params"], ["name", "params"])
        name, params = table.get("name"), table.get("params", {})
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: {what} name: expected a policy name, got {_show(name)}")
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where}: {what} params: expected a table, got {_show(params)}")
        _check_policy(where, what, f"{what} params:", name, params, policy_names)


def _build(where: str, table: str, cls: type, raw: dict) -> Any:
    known = [f.name for f in fields(cls)]
    _unknown(where, f"[{table}]", raw, known, known)
    values = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        try:
            values[f.name] = f.metadata["check"](raw[f.name])
        except _Bad as bad:
            raise ConfigError(f"{where}: [{table}] {f.name}: expected {bad.expected}, "
                              f"got {_show(raw[f.name])}") from None
    return cls(**values)


def _unknown(where: str, what: str, raw: dict, shown: list[str], known: list[str]) -> None:
    extra = [k for k in raw if k not in known]
    if extra:
        raise ConfigError(f"{where}: unknown key {extra[0]!r} in {what}; "
                          f"valid keys: {', '.join(shown)}")


def _show(v: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(v), type(v).__name__)
    text = repr(v) if not isinstance(v, (dict, list)) else json.dumps(v, default=str)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# -- the example file ---------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string uses the same escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML rendering for {type(v).__name__}")


def example_toml() -> str:
    """A fully commented ``hpcsched.toml`` that sets every key to its default.

    Parsing it gives the same settings as having no file at all.
    """
    lines = [
        "# hpcsched daemon configuration (TOML).",
        f"# Read from: hpcsched daemon --config PATH, else ${ENV_CONFIG}, else {DEFAULT_PATH}.",
        "# Every key is optional and shown with its default. Unknown keys are errors.",
    ]
    for table, cls in _TABLES.items():
        lines += ["", f"[{table}]"]
        for f in fields(cls):
            if cls is PolicySettings and f.name in ("params", "partitions"):
                continue
            lines += [f"# {f.metadata['help']}", f"{f.name} = {_toml_value(f.default)}"]
    params, parts = (next(f for f in fields(PolicySettings) if f.name == n)
                     for n in ("params", "partitions"))
    lines += ["", "[policy.params]", f"# {params.metadata['help']}; empty by default", "",
              f"# {parts.metadata['help']}; none by default, e.g.:",
              "# [policy.partitions.a100]", '# name = "pollux"', ""]
    return "\n".join(lines)
