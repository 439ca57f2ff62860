"""The wheel (issue 34, item 2): built from the checkout and installed outside it, into a fresh
virtual environment and with ``pip install --user``, it carries the files hpcsched ships beside
its code (hpcsched/resources.py) and its commands run from there; ``pip install hpcsched`` asks
for the job side's packages only, ``hpcsched[daemon]`` for the rest.

The dependencies come from this checkout's environment (``PYTHONPATH`` = its site-packages,
which holds no ``hpcsched`` package: the checkout is installed editable, through a ``.pth``
file that ``PYTHONPATH`` does not run), so the test needs no network."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DAEMON_ONLY = {"sqlalchemy", "alembic", "scipy", "matplotlib", "rich", "prometheus-client"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the checkout's files (git's: tracked, and new ones not ignored), built from
    a copy so that setuptools' ``build/`` stays out of the checkout."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_symlink() or (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name, follow_symlinks=False)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("hpcsched-*.whl")
    return path


def _requirements(wheel: Path) -> tuple[set[str], dict[str, set[str]]]:
    """The wheel's base requirements and its extras', by project name."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.message_from_bytes(z.read(meta))
    base, extras = set(), {}
    for req in msg.get_all("Requires-Dist"):
        name = req.split(";")[0].split("[")[0].strip().split(">")[0].split("<")[0].split("=")[0]
        name = name.strip().lower().replace("_", "-")
        if "extra ==" in req:
            extras.setdefault(req.split("extra ==")[1].strip(" '\""), set()).add(name)
        else:
            base.add(name)
    return base, extras


def test_the_job_side_asks_for_no_daemon_package(wheel):
    base, extras = _requirements(wheel)
    assert base == {"click", "numpy"}, base
    assert DAEMON_ONLY <= extras["daemon"], extras
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for shipped in ("hpcsched/_share/slurm-plugins/job_submit.lua",
                    "hpcsched/_share/systemd/hpcsched.service",
                    "hpcsched/_share/grafana-hpcsched.json",
                    "hpcsched/_share/jobscripts/hpcsched-job.sbatch",
                    "hpcsched/_share/jobscripts/examples/emulated.py",
                    "hpcsched/_share/db/env.py", "hpcsched/_share/db/versions/0001_initial_schema.py"):
        assert shipped in names, shipped


def _clean_env() -> dict[str, str]:
    """This environment without hpcsched's and Python's variables (a ``PYTHONPATH`` naming a
    checkout would make pip see hpcsched as installed already)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("HPCSCHED_", "PYTHON"))}


def _env(tmp_path: Path, **extra) -> dict[str, str]:
    return {**_clean_env(), "PYTHONPATH": sysconfig.get_paths()["purelib"],
            "HPCSCHED_CONTROL_DIR": str(tmp_path / "jobs"),
            "HPCSCHED_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}", **extra}


def _run(tmp_path, env, *cmd) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r.stdout


def _check_installed(tmp_path: Path, env: dict, bin_dir: Path, python: str, where: Path) -> None:
    located = _run(tmp_path, env, python, "-c", "import hpcsched, hpcsched.resources as r; "
                   "print(hpcsched.__file__); print(r.shared('db'))")
    assert all(Path(p).is_relative_to(where) for p in located.split()), located   # not the checkout
    (tmp_path / "train.py").write_text("print('training')\n")
    script = _run(tmp_path, env, bin_dir / "hpcsub", "--hpcsched-print-script", "-N", "1",
                  "--gres=gpu:2", "train.py")
    assert "#HPCSCHED job=" in script and "hpcsched.launcher" in script, script
    _run(tmp_path, env, bin_dir / "hpcsched", "db", "upgrade")
    sim = _run(tmp_path, env, bin_dir / "hpcsched", "simulate", "-w", "pollux:1@0.5", "-p", "static")
    assert "80/80" in sim, sim
    assert "emulated.py" in _run(tmp_path, env, bin_dir / "hpcsched", "replay", "--help")
    out = _run(tmp_path, env, bin_dir / "hpcsched", "install-files", tmp_path / "admin")
    assert (tmp_path / "admin" / "systemd" / "hpcsched.service").is_file(), out
    assert os.access(tmp_path / "admin" / "slurm-plugins" / "prolog-gpu-probe", os.X_OK)


def test_the_wheel_runs_from_a_fresh_virtual_environment(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   env=_clean_env())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "-q", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True,
                   timeout=300, env=_clean_env())
    _check_installed(tmp_path, _env(tmp_path), venv / "bin", str(venv / "bin" / "python"), venv)


@pytest.mark.skipif(not shutil.which("python3", path="/usr/bin"), reason="no system Python")
def test_the_wheel_runs_from_a_user_install(wheel, tmp_path):
    """``pip install --user``: files under ``~/.local``, not under ``sys.prefix``."""
    base = tmp_path / "userbase"
    env = _env(tmp_path, PYTHONUSERBASE=str(base))
    r = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "-q", "--user", "--no-deps",
                        "--no-index", "--break-system-packages", str(wheel)],
                       env={**_clean_env(), "PYTHONUSERBASE": str(base)},
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("the system Python has no pip")
    assert r.returncode == 0, r.stderr
    _check_installed(tmp_path, env, base / "bin", "/usr/bin/python3", base)


def test_a_daemon_command_on_a_job_side_install_says_what_to_install(monkeypatch):
    import importlib

    from click.testing import CliRunner

    from hpcsched.cli import main

    real = importlib.import_module

    def without_sqlalchemy(name, *a, **kw):
        if name == "hpcsched.daemon.status":
            raise ModuleNotFoundError("No module named 'sqlalchemy'", name="sqlalchemy")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", without_sqlalchemy)
    r = CliRunner().invoke(main, ["status"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "hpcsched status needs sqlalchemy" in r.output and "hpcsched[daemon]" in r.output
