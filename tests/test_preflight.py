"""``hpcsched check`` (hpcsched/daemon/preflight.py): each check on fake facts, the parsers on what
the dev cluster's Slurm 22.05.8 printed, the command through click's CliRunner with Slurm faked,
and the daemon refusing to start on a partition Slurm does not have. No Slurm is called here."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcsched.daemon import preflight as pf
from hpcsched.daemon import service as daemon_service
from hpcsched.daemon.config import DaemonSettings, load
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable

# What the dev cluster (Slurm 22.05.8, 4 nodes, slurmdbd) printed.
PARTITION_LINE = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO "
    "MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-4] "
    "PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE "
    "PreemptMode=OFF State=UP TotalCPUs=32 TotalNodes=4 SelectTypeParameters=NONE "
    "JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=32,mem=62.50G,node=4,billing=32,gres/gpu=16\n")
CONFIG_TEXT = """Configuration data as of 2026-11-30T10:00:00
AccountingStorageEnforce = none
Epilog                  = /var/lib/hpcsched/devcluster/etc/epilog
JobSubmitPlugins        = lua
Prolog                  = /var/lib/hpcsched/devcluster/etc/prolog
PrologFlags             = (null)
SLURM_CONF              = /var/lib/hpcsched/devcluster/etc/slurm.conf

Cgroup Support Configuration:
Prolog                  = not this one
"""
QOS_TEXT, ASSOC_TEXT = "normal||\n", "root|||\nroot|root||\n"

GPU = pf.parse_partitions(PARTITION_LINE)
CONFIG = pf.parse_config(CONFIG_TEXT)
EXT = DaemonSettings()   # grow = extension, granularity auto (gpu)


# ------------------------------------------------------------------ parsers
def test_parsers_read_what_slurm_22_05_printed():
    assert list(GPU) == ["gpu"] and GPU["gpu"]["State"] == "UP" and GPU["gpu"]["Nodes"] == "n[1-4]"
    assert GPU["gpu"]["TRES"] == "cpu=32,mem=62.50G,node=4,billing=32,gres/gpu=16"
    assert CONFIG["JobSubmitPlugins"] == "lua" and CONFIG["PrologFlags"] == "(null)"
    assert CONFIG["Prolog"] == "/var/lib/hpcsched/devcluster/etc/prolog", "the first one wins"
    assert pf.parse_limits(QOS_TEXT, ASSOC_TEXT) == ()


def test_parse_limits_names_each_limit():
    got = pf.parse_limits("normal||\ndebug|1|4\n", "ml|alice|2|\nml||1|\n")
    assert got == (("QOS debug MaxJobsPerUser=1", 1), ("QOS debug MaxSubmitJobsPerUser=4", 4),
                   ("user alice (account ml) MaxJobs=2", 2), ("account ml MaxJobs=1", 1))


# ------------------------------------------------------------------ partitions
def test_a_partition_slurm_lacks_fails_and_names_it():
    r = pf.check_partitions(["gpu", "nosuch"], GPU, None, "/etc/hpcsched/hpcsched.toml")
    assert r.status == pf.FAIL and r.name == "partitions"
    assert "nosuch: not a Slurm partition (Slurm has: gpu)" in r.text
    assert "/etc/hpcsched/hpcsched.toml" in r.text


def test_partitions_ok_down_all_and_slurm_down():
    assert pf.check_partitions(["gpu"], GPU, None).status == pf.OK
    assert pf.check_partitions([], GPU, None).status == pf.OK
    down = pf.check_partitions(["gpu"], {"gpu": {"State": "DOWN"}}, None)
    assert down.status == pf.WARN and "gpu State=DOWN" in down.text
    gone = pf.check_partitions(["gpu"], None, "scontrol: Unable to contact slurm controller")
    assert gone.status == pf.FAIL and "Slurm does not answer" in gone.text
    assert pf.check_partitions([], None, "x").status == pf.FAIL, "Slurm down fails even for []"


# ------------------------------------------------------------------ control directory
def test_control_dir_modes(tmp_path):
    d = tmp_path / "jobs"
    missing = pf.check_control_dir(pf.gather_control_dir(d))
    assert missing.status == pf.WARN and f"install -d -m 1777 {d}" in missing.text
    d.mkdir()
    os.chmod(d, 0o755)
    r = pf.check_control_dir(pf.gather_control_dir(d))
    assert r.status == pf.WARN and "mode 0755" in r.text and f"chmod 1777 {d}" in r.text
    os.chmod(d, 0o1777)
    assert pf.check_control_dir(pf.gather_control_dir(d)).status == pf.OK
    os.chmod(d, 0o3777)   # setgid on top is fine
    assert pf.check_control_dir(pf.gather_control_dir(d)).status == pf.OK
    f = tmp_path / "file"
    f.write_text("")
    assert pf.check_control_dir(pf.gather_control_dir(f)).status == pf.FAIL


# ------------------------------------------------------------------ Slurm version
@pytest.mark.parametrize("version,status", [
    ((21, 8), pf.FAIL), ((22, 5), pf.OK), ((23, 11), pf.OK), ((24, 11), pf.OK), ((26, 5), pf.OK),
    ((26, 11), pf.WARN), (None, pf.FAIL)])
def test_slurm_versions(version, status):
    r = pf.check_version(version, "sinfo: not found")
    assert r.status == status, r.text
    if version == (24, 11):
        assert r.text.startswith("Slurm 24.11")


# ------------------------------------------------------------------ plugins
def test_plugins_as_the_dev_cluster_wires_them():
    sub, prolog, epilog = pf.check_plugins(CONFIG, None)
    assert (sub.status, prolog.status, epilog.status) == (pf.OK, pf.WARN, pf.OK)
    assert "without PrologFlags=Alloc" in prolog.text


def test_plugins_not_wired_warn_never_fail():
    results = pf.check_plugins({"JobSubmitPlugins": "(null)", "Prolog": "(null)"}, None)
    assert [r.status for r in results] == [pf.WARN] * 3
    wired = {"JobSubmitPlugins": "lua", "Prolog": "/p", "PrologFlags": "Alloc,Contain", "Epilog": "/e"}
    assert [r.status for r in pf.check_plugins(wired, None)] == [pf.OK] * 3
    (unknown,) = pf.check_plugins(None, "Slurm does not answer")
    assert unknown.status == pf.WARN and "Slurm does not answer" in unknown.text


# ------------------------------------------------------------------ store
def test_store_missing_unmigrated_current(tmp_path):
    from hpcsched.daemon.store import Store

    url = f"sqlite:///{tmp_path / 'db' / 'h.db'}"
    r = pf.check_store(pf.gather_store(url))
    assert r.status == pf.WARN and "no database yet" in r.text and "hpcsched db upgrade" in r.text
    assert not (tmp_path / "db").exists(), "check creates nothing"
    (tmp_path / "db").mkdir()
    with Store(url) as s:
        assert s.current_revision() is None   # an empty file, never migrated
    facts = pf.gather_store(url)
    r = pf.check_store(facts)
    assert r.status == pf.WARN and f"revision none, newest {facts.head}" in r.text
    with Store(url) as s:
        s.upgrade()
    r = pf.check_store(pf.gather_store(url))
    assert r.status == pf.OK and f"revision {facts.head} (newest), writable" in r.text


def test_store_an_older_revision_warns_an_unknown_one_fails():
    known = ("0002", "0001")
    old = pf.check_store(pf.StoreFacts("sqlite:///h.db", "0001", "0002", known))
    assert old.status == pf.WARN and "revision 0001, newest 0002" in old.text
    new = pf.check_store(pf.StoreFacts("sqlite:///h.db", "0009", "0002", known))
    assert new.status == pf.FAIL and "unknown to this hpcsched" in new.text
    ro = pf.check_store(pf.StoreFacts("sqlite:///h.db", "0002", "0002", known,
                                      not_writable="/var/lib/hpcsched not writable by uid 1000"))
    assert ro.status == pf.FAIL and "not writable" in ro.text
    assert pf.check_store(pf.StoreFacts("postgresql://x", error="refused")).status == pf.FAIL


# ------------------------------------------------------------------ extension jobs
def test_extensions():
    from dataclasses import replace

    assert pf.check_extensions(replace(EXT, grow="requeue", granularity="node"), None, None,
                               {}).status == pf.OK
    assert pf.check_extensions(EXT, CONFIG, None, {}).status == pf.OK   # enforce = none
    unknown = pf.check_extensions(EXT, None, None, {"config": "Slurm does not answer"})
    assert unknown.status == pf.WARN and "unknown" in unknown.text
    enforced = {**CONFIG, "AccountingStorageEnforce": "associations,limits,qos"}
    assert pf.check_extensions(EXT, enforced, None, {"limits": "sacctmgr: no"}).status == pf.WARN
    assert pf.check_extensions(EXT, enforced, (), {}).status == pf.OK
    one = pf.check_extensions(EXT, enforced, (("QOS debug MaxJobsPerUser=1", 1),), {})
    assert one.status == pf.WARN and "QOS debug MaxJobsPerUser=1" in one.text
    assert 'grow = "requeue"' in one.text
    assert pf.check_extensions(EXT, enforced, (("QOS x MaxJobsPerUser=8", 8),), {}).status == pf.OK
    site = pf.check_extensions(EXT, {**CONFIG, "JobSubmitPlugins": "lua,site_rules"}, None, {})
    assert site.status == pf.WARN and "site_rules" in site.text


# ------------------------------------------------------------------ gathering with Slurm faked
QOS_TEXT = "normal|hpcsched-lend|cluster|00:00:00\nhpcsched-lend||cancel|00:01:00\n"


@pytest.mark.parametrize("preempt_type, qos_text, status, words", [
    ("preempt/qos", QOS_TEXT, "ok", "preempted by normal (GraceTime 60 s)"),
    ("preempt/none", QOS_TEXT, "FAIL", "PreemptType=preempt/none"),
    ("preempt/qos", "normal||cluster|00:00:00\n", "FAIL", "no such QOS"),
    ("preempt/qos", QOS_TEXT.replace("normal|hpcsched-lend", "normal|"), "FAIL",
     "no QOS preempts it"),
    ("preempt/qos", QOS_TEXT.replace("00:01:00", "00:00:00"), "warn", "GraceTime 0"),
])
def test_lending_needs_a_qos_that_slurm_preempts(preempt_type, qos_text, status, words):
    facts = pf.SlurmFacts((22, 5), GPU, {**CONFIG, "PreemptType": preempt_type}, None,
                          extension_qos="hpcsched-lend", qos=pf.parse_qos(qos_text))
    r = pf.check_lending(EXT, facts)
    assert (r.status, r.name) == (status, "lending") and words in r.text, r.text


@pytest.mark.parametrize("daemon, plugin, status, words", [
    ("", "/run/hpcsched/submitted", "ok", "within a second of another user's submission"),
    ("/run/hpcsched/submitted", "/run/hpcsched/submitted", "ok", "(submit_stamp /run/hpcsched"),
    ("/tmp/elsewhere", "/run/hpcsched/submitted", "FAIL", "would never see it change"),
    ("/run/hpcsched/submitted", None, "warn", "sets no submit_stamp"),
    ("", None, "warn", "no extension_qos nor submit_stamp"),
])
def test_lending_by_the_daemon_is_prompt_with_the_plugins_stamp(daemon, plugin, status, words):
    facts = pf.SlurmFacts((22, 5), GPU, CONFIG, None, submit_stamp=plugin)
    r = pf.check_lending(replace(EXT, submit_stamp=daemon), facts)
    assert (r.status, r.name) == (status, "lending") and words in r.text, r.text


def test_lending_without_extension_qos_warns_and_reads_no_qos(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))   # no plugin settings there
    texts = {"partition": PARTITION_LINE, "config": CONFIG_TEXT}
    monkeypatch.setattr(pf, "run", lambda args, timeout: texts[next(w for w in texts if w in args)])
    monkeypatch.setattr(pf, "slurm_version", lambda timeout: (22, 5))
    facts = pf.gather_slurm(EXT)
    assert facts.extension_qos is None and facts.qos is None
    assert pf.check_lending(EXT, facts).status == "warn"
    (tmp_path / "job_submit_hpcsched.conf").write_text("extension_qos = hpcsched-lend\n")
    texts["qos"] = QOS_TEXT
    facts = pf.gather_slurm(EXT)
    assert facts.extension_qos == "hpcsched-lend" and "hpcsched-lend" in facts.qos


def test_gather_slurm_asks_a_dead_controller_once(monkeypatch):
    calls = []

    def run(args, timeout):
        calls.append(args[:2])
        raise SlurmUnavailable("scontrol -a -o: a; b; Unable to contact slurm controller")

    monkeypatch.setattr(pf, "run", run)
    monkeypatch.setattr(pf, "slurm_version", lambda timeout: (22, 5))
    facts = pf.gather_slurm(EXT)
    assert calls == [["scontrol", "-a"]] and facts.version == (22, 5)
    assert facts.errors["partitions"] == "scontrol -a -o: Unable to contact slurm controller"
    assert facts.partitions is None and facts.config is None


def test_gather_slurm_reads_limits_only_where_enforced(monkeypatch):
    texts = {"partition": PARTITION_LINE, "config": CONFIG_TEXT.replace("= none", "= limits"),
             "qos": "normal|1|\n", "assoc": ASSOC_TEXT}
    asked = []
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")   # no extension_qos: no qos asked

    def run(args, timeout):
        asked.append(next(w for w in texts if w in args))
        return texts[asked[-1]]

    monkeypatch.setattr(pf, "run", run)
    monkeypatch.setattr(pf, "slurm_version", lambda timeout: (22, 5))
    facts = pf.gather_slurm(EXT)
    assert facts.job_limits == (("QOS normal MaxJobsPerUser=1", 1),) and not facts.errors
    assert asked == ["partition", "config", "qos", "assoc"]
    texts["config"] = CONFIG_TEXT   # AccountingStorageEnforce = none: sacctmgr is not asked
    asked.clear()
    assert pf.gather_slurm(EXT).job_limits is None and asked == ["partition", "config"]


# ------------------------------------------------------------------ the command
@pytest.fixture
def site(tmp_path, monkeypatch):
    """A config naming ``nosuch`` beside ``gpu``, a control dir of mode 0755, a migrated store,
    and Slurm faked as the dev cluster."""
    from hpcsched.daemon.store import Store

    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    (tmp_path / "jobs").mkdir(mode=0o755)
    os.chmod(tmp_path / "jobs", 0o755)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with Store(url) as s:
        s.upgrade()
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\npartitions = ["gpu", "nosuch"]\ncontrol_dir = "{tmp_path}/jobs"\n'
                   f'database_url = "{url}"\nlock_file = "{tmp_path}/d.lock"\n')
    facts = pf.SlurmFacts((22, 5), GPU, CONFIG, None)
    monkeypatch.setattr(pf, "gather_slurm", lambda d: facts)
    return cfg


def test_check_command_fails_on_a_missing_partition(site):
    r = CliRunner().invoke(pf.check_command, ["--config", str(site)])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    assert [ln.split()[0] for ln in lines] == ["ok", "FAIL", "warn", "ok", "ok", "warn", "ok",
                                                "ok", "ok", "warn"]
    assert "no extension_qos" in lines[-1]
    assert "nosuch: not a Slurm partition" in lines[1] and "chmod 1777" in lines[2]
    assert "Traceback" not in r.output


def test_check_command_passes_when_nothing_fails(site):
    site.write_text(site.read_text().replace(', "nosuch"', ""))
    os.chmod(Path(site.parent, "jobs"), 0o1777)
    r = CliRunner().invoke(pf.check_command, ["--config", str(site)])
    assert r.exit_code == 0, r.output
    assert "FAIL" not in r.output


def test_a_configuration_error_is_one_fail_line(site):
    site.write_text("[daemon]\nround_intervall = 5\n")
    r = CliRunner().invoke(pf.check_command, ["--config", str(site)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    (line,) = r.output.splitlines()
    assert line.startswith("FAIL  config") and "round_intervall" in line


def test_check_is_a_subcommand():
    from hpcsched.cli import main

    r = CliRunner().invoke(main, ["check", "--help"])
    assert r.exit_code == 0 and "--config" in r.output


# ------------------------------------------------------------------ the daemon's start
def test_start_refusal(site, monkeypatch):
    settings = load(site)
    monkeypatch.setattr(pf, "read_partitions", lambda timeout: GPU)
    line = pf.start_refusal(settings)
    assert line.startswith("Error: nosuch: not a Slurm partition") and str(site) in line

    def down(timeout):
        raise SlurmUnavailable("scontrol: Unable to contact slurm controller")

    monkeypatch.setattr(pf, "read_partitions", down)
    assert pf.start_refusal(settings) is None, "Slurm down: start as before, the rounds retry"
    monkeypatch.setattr(pf, "read_partitions", lambda timeout: pytest.fail("asked Slurm"))
    from dataclasses import replace
    assert pf.start_refusal(replace(settings, daemon=replace(settings.daemon, partitions=()))) is None


def test_the_daemon_exits_2_on_a_missing_partition(site, monkeypatch):
    monkeypatch.setattr(pf, "read_partitions", lambda timeout: GPU)
    r = CliRunner().invoke(daemon_service.daemon_command, ["--config", str(site), "--once"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [
        f"Error: nosuch: not a Slurm partition (Slurm has: gpu); fix [daemon] partitions in {site}"]
    assert not Path(site.parent, "d.lock").exists(), "refused before taking the lock"


def test_the_daemon_starts_when_slurm_fails_at_start(site, monkeypatch):
    def broken(timeout):
        raise SlurmError("scontrol: not found; is Slurm installed and on PATH?")

    class Reached(Exception):
        pass

    class Lock:
        def __init__(self, path):
            pass

        def acquire(self):
            raise Reached   # the daemon went on past the check: stop it here

    monkeypatch.setattr(pf, "read_partitions", broken)
    monkeypatch.setattr(daemon_service, "HostLock", Lock)
    r = CliRunner().invoke(daemon_service.daemon_command, ["--config", str(site), "--once"])
    assert isinstance(r.exception, Reached), r.output


def test_a_daemon_without_a_control_dir_is_warned(tmp_path):
    """Neither [daemon] control_dir nor $HPCSCHED_CONTROL_DIR: the daemon would read its own
    user's ~/.hpcsched/jobs and see no other user's job."""
    from hpcsched.daemon import preflight
    from hpcsched.daemon.config import Settings

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\ncontrol_dir = "{tmp_path}"\n')
    why = preflight.control_dir_unset(Settings(), env={})
    assert why and "[daemon] control_dir is not set" in why
    assert preflight.control_dir_unset(Settings(), env={"HPCSCHED_CONTROL_DIR": "/shared/jobs"}) is None
    assert preflight.control_dir_unset(preflight.load(cfg), env={}) is None
    r = preflight.check_control_dir(preflight.DirFacts(tmp_path, True, True, 0o1777), why)
    assert (r.status, r.name) == (preflight.WARN, "control-dir")
