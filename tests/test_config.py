"""The daemon's TOML settings: defaults, the example file, lookup order and every kind of mistake."""

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from hpcsched.daemon import config as cfg
from hpcsched.daemon.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
NO_ENV: dict[str, str] = {}


def _write(tmp_path, text, name="hpcsched.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _error(tmp_path, text, **kw) -> str:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        cfg.load(p, env=NO_ENV, **kw)
    msg = str(info.value)
    assert "\n" not in msg, "messages are one line"
    assert msg.startswith(str(p)), "messages start with the file's path"
    return msg


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(cfg, "DEFAULT_PATH", tmp_path / "absent.toml")
    s = cfg.load(env=NO_ENV)
    assert s.path is None
    assert s == cfg.defaults()
    d = s.daemon
    assert d.round_interval == 60.0 and d.partitions == ("gpu",) and d.control_dir == ""
    assert d.database_url == "sqlite:////var/lib/hpcsched/hpcsched.db"
    assert d.dry_run is False and d.restart_cost == 30.0 and d.shrink_cost == 2.0
    assert d.min_gain == 0.05 and d.lock_file == "/run/hpcsched/daemon.lock"
    assert d.log_level == "info" and d.slurm_timeout == 20.0 and d.ack_timeout == 180.0
    assert d.hold_rounds == 3
    assert s.policy.name == "jct" and s.policy.seed == 0 and dict(s.policy.params) == {}
    assert cfg.DEFAULT_PATH == tmp_path / "absent.toml"


def test_default_path_is_etc():
    assert cfg.DEFAULT_PATH == Path("/etc/hpcsched/hpcsched.toml")


def test_example_parses_to_the_defaults(tmp_path):
    text = cfg.example_toml()
    s = cfg.load(_write(tmp_path, text), env=NO_ENV)
    assert s.daemon == cfg.DaemonSettings()
    assert s.policy == cfg.PolicySettings()
    assert s.path == tmp_path / "hpcsched.toml"
    # every key is there, each with a comment
    for name in ("round_interval", "partitions", "control_dir", "database_url", "dry_run",
                 "restart_cost", "shrink_cost", "min_gain", "lock_file", "log_level",
                 "slurm_timeout", "ack_timeout", "name", "seed"):
        assert f"\n{name} = " in text
    assert "[policy.params]" in text


def test_docs_show_the_current_example():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert cfg.example_toml().strip() in doc, "regenerate the example in docs/configuration.md"


def test_full_file(tmp_path):
    p = _write(tmp_path, """
[daemon]
round_interval = 30          # an integer is fine for a float
partitions = []
control_dir = "~/jobs"
database_url = "postgresql+psycopg://u:p@db/hpcsched"
dry_run = true
restart_cost = 0
shrink_cost = 1.5
min_gain = 0.1
lock_file = "/tmp/x.lock"
log_level = "DEBUG"
slurm_timeout = 5.0
ack_timeout = 60

[policy]
name = "greedy"
seed = 7
[policy.params]
horizon = 600.0
weights = [1, 2]
[policy.params.nested]
a = 1
""")
    s = cfg.load(p, env=NO_ENV, policy_names=["dp", "greedy"])
    d = s.daemon
    assert d.round_interval == 30.0 and isinstance(d.round_interval, float)
    assert d.partitions == () and d.dry_run is True and d.restart_cost == 0.0
    assert d.log_level == "debug" and d.ack_timeout == 60.0
    assert d.database_url == "postgresql+psycopg://u:p@db/hpcsched"
    assert s.control_dir_path() == Path.home() / "jobs"
    assert s.policy.name == "greedy" and s.policy.seed == 7
    assert s.policy.params["horizon"] == 600.0 and s.policy.params["weights"] == (1, 2)
    assert s.policy.params["nested"]["a"] == 1


def test_settings_are_immutable(tmp_path):
    s = cfg.load(_write(tmp_path, "[policy.params]\nx = 1\n[policy.params.t]\ny = [1]\n"),
                 env=NO_ENV)
    with pytest.raises(FrozenInstanceError):
        s.daemon.round_interval = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.policy.params["x"] = 2  # type: ignore[index]
    with pytest.raises(TypeError):
        s.policy.params["t"]["y"] = 2  # type: ignore[index]


def test_control_dir_default_follows_jobdir(monkeypatch, tmp_path):
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(tmp_path / "ctl"))
    assert cfg.defaults().control_dir_path() == tmp_path / "ctl"
    monkeypatch.delenv("HPCSCHED_CONTROL_DIR")
    assert cfg.defaults().control_dir_path() == Path.home() / ".hpcsched" / "jobs"


@pytest.mark.parametrize("text, table, key, valid", [
    ("[daemon]\nround_intervall = 1\n", "[daemon]", "round_intervall",
     ["round_interval", "partitions", "ack_timeout"]),
    ("[policy]\nnme = 'dp'\n", "[policy]", "nme", ["name", "seed", "params"]),
    ("[policy.extra]\nx = 1\n", "[policy]", "extra", ["name", "seed", "params"]),
    ("[daemon.sub]\nx = 1\n", "[daemon]", "sub", ["round_interval", "database_url"]),
    ("[deamon]\nround_interval = 1\n", "top level", "deamon", ["[daemon]", "[policy]"]),
    ("round_interval = 1\n", "top level", "round_interval", ["[daemon]", "[policy]"]),
])
def test_unknown_key_lists_the_valid_ones(tmp_path, text, table, key, valid):
    msg = _error(tmp_path, text)
    assert f"unknown key {key!r} in {table}" in msg
    for v in valid:
        assert v in msg.split("valid keys:")[1]


@pytest.mark.parametrize("text, key, expected", [
    ("[daemon]\nround_interval = 0\n", "[daemon] round_interval", "a number > 0"),
    ("[daemon]\nround_interval = 'soon'\n", "[daemon] round_interval", "a number > 0"),
    ("[daemon]\nround_interval = true\n", "[daemon] round_interval", "a number > 0"),
    ("[daemon]\nround_interval = nan\n", "[daemon] round_interval", "a number > 0"),
    ("[daemon]\nrestart_cost = -1\n", "[daemon] restart_cost", "a number >= 0"),
    ("[daemon]\nshrink_cost = -0.5\n", "[daemon] shrink_cost", "a number >= 0"),
    ("[daemon]\nmin_gain = -0.01\n", "[daemon] min_gain", "a number >= 0"),
    ("[daemon]\nslurm_timeout = 0\n", "[daemon] slurm_timeout", "a number > 0"),
    ("[daemon]\npartitions = 'gpu'\n", "[daemon] partitions", "a list of non-empty strings"),
    ("[daemon]\npartitions = ['gpu', 3]\n", "[daemon] partitions", "a list of non-empty strings"),
    ("[daemon]\ndry_run = 1\n", "[daemon] dry_run", "a boolean"),
    ("[daemon]\ndry_run = 'yes'\n", "[daemon] dry_run", "a boolean"),
    ("[daemon]\ncontrol_dir = 5\n", "[daemon] control_dir", "a string"),
    ("[daemon]\nlock_file = ''\n", "[daemon] lock_file", "a non-empty string"),
    ("[daemon]\nlog_level = 'verbose'\n", "[daemon] log_level", "one of debug|info|warning|error"),
    ("[daemon]\ndatabase_url = '/var/lib/x.db'\n", "[daemon] database_url", "an SQLAlchemy URL"),
    ("[policy]\nseed = 1.5\n", "[policy] seed", "an integer"),
    ("[policy]\nseed = false\n", "[policy] seed", "an integer"),
    ("[policy]\nname = ''\n", "[policy] name", "a non-empty string"),
    ("[policy]\nparams = 3\n", "[policy] params", "a table"),
])
def test_wrong_type_or_range_names_key_and_expectation(tmp_path, text, key, expected):
    msg = _error(tmp_path, text)
    assert f"{key}: expected {expected}" in msg
    assert ", got " in msg


def test_table_that_is_not_a_table(tmp_path):
    assert "[daemon] must be a table" in _error(tmp_path, "daemon = 3\n")


def test_not_toml(tmp_path):
    msg = _error(tmp_path, "[daemon\nround_interval = 1\n")
    assert "not valid TOML" in msg


def test_missing_explicit_file_is_an_error(tmp_path):
    p = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="configuration file not found") as info:
        cfg.load(p, env=NO_ENV)
    assert str(p) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_env_config_path(tmp_path, monkeypatch):
    monkeypatch.setattr(cfg, "DEFAULT_PATH", tmp_path / "default.toml")
    _write(tmp_path, "[daemon]\nround_interval = 1\n", "default.toml")
    env_file = _write(tmp_path, "[daemon]\nround_interval = 2\n", "env.toml")
    arg_file = _write(tmp_path, "[daemon]\nround_interval = 3\n", "arg.toml")
    env = {"HPCSCHED_CONFIG": str(env_file)}
    assert cfg.load(env=NO_ENV).daemon.round_interval == 1.0
    assert cfg.load(env=env).daemon.round_interval == 2.0
    assert cfg.load(env=env).path == env_file
    assert cfg.load(arg_file, env=env).daemon.round_interval == 3.0
    # a path named by the environment is as explicit as --config
    with pytest.raises(ConfigError, match="not found"):
        cfg.load(env={"HPCSCHED_CONFIG": str(tmp_path / "gone.toml")})


def test_env_from_os_environ(tmp_path, monkeypatch):
    f = _write(tmp_path, "[policy]\nseed = 11\n")
    monkeypatch.setenv("HPCSCHED_CONFIG", str(f))
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", "sqlite:////tmp/env.db")
    s = cfg.load()
    assert s.policy.seed == 11 and s.daemon.database_url == "sqlite:////tmp/env.db"


def test_env_database_url_overrides_the_file(tmp_path):
    p = _write(tmp_path, "[daemon]\ndatabase_url = 'sqlite:////tmp/file.db'\n")
    assert cfg.load(p, env=NO_ENV).daemon.database_url == "sqlite:////tmp/file.db"
    s = cfg.load(p, env={"HPCSCHED_DATABASE_URL": "mysql+pymysql://h/db"})
    assert s.daemon.database_url == "mysql+pymysql://h/db"
    with pytest.raises(ConfigError, match="HPCSCHED_DATABASE_URL"):
        cfg.load(p, env={"HPCSCHED_DATABASE_URL": "not a url"})


def test_policy_name_validated_against_registry(tmp_path):
    p = _write(tmp_path, "[policy]\nname = 'fifo'\n")
    assert cfg.load(p, env=NO_ENV).policy.name == "fifo"  # no registry given: anything goes
    with pytest.raises(ConfigError) as info:
        cfg.load(p, env=NO_ENV, policy_names={"dp", "greedy"})
    msg = str(info.value)
    assert "unknown policy 'fifo'" in msg and "dp, greedy" in msg and str(p) in msg
    assert cfg.load(p, env=NO_ENV, policy_names=["fifo"]).policy.name == "fifo"


def test_policy_help_names_every_registered_policy_and_the_default_is_one():
    from hpcsched.policies import POLICIES

    (line,) = [ln for ln in cfg.example_toml().splitlines() if ln.startswith("# scheduling policy")]
    assert line == f"# scheduling policy ({', '.join(POLICIES)})"
    assert cfg.defaults().policy.name in POLICIES
