"""The GPU probe prolog and the job-mapping epilog (issue 13, part 2), run for real: the probe
module as a subprocess with a prolog's environment, and the sh scripts under /bin/sh with an
env file, including every way the probe can fail (the prolog must still exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.probe.__main__ import ProbeEnvError, gpu_indices
from hpcsched.protocol.probes import KIND_CPU, parse_record

ROOT = Path(__file__).resolve().parents[1]
PROLOG = ROOT / "slurm-plugins" / "prolog-gpu-probe"
EPILOG = ROOT / "slurm-plugins" / "epilog-job-mapping"


def _prolog_env(tmp_path, **extra) -> dict[str, str]:
    """The few variables slurmd gives a prolog, and no others (no PATH, no PYTHONPATH)."""
    return {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,2",
            "HPCSCHED_ENV_FILE": str(tmp_path / "hpcsched.env"), **extra}


def _env_file(tmp_path, text: str = "", python: str = sys.executable) -> Path:
    f = tmp_path / "hpcsched.env"
    f.write_text(f"HPCSCHED_PYTHON={python}\nHPCSCHED_PROBE_DIR={tmp_path / 'spool'}\n"
                 f"HPCSCHED_JOB_MAPPING_DIR={tmp_path / 'map'}\nHPCSCHED_PROBE_SECONDS=0.4\n"
                 f"HPCSCHED_PROBE_BACKEND=cpu\n{text}")
    return f


def _run(script: Path, env: dict, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd="/")
    return r, time.monotonic() - t0


# -- the probe module ---------------------------------------------------------------------------


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_GPUS": "0,2"}, ["0", "2"]),
    ({"SLURM_JOB_GPUS": "3-5,1"}, ["1", "3", "4", "5"]),
    ({"GPU_DEVICE_ORDINAL": "1"}, ["1"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, ["2", "3"]),
    ({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, ["1"]),   # Slurm's own first
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, []),
    ({}, []),
])
def test_gpu_indices(env, expected):
    assert gpu_indices(env) == expected


def test_gpu_indices_refuse_uuids():
    with pytest.raises(ProbeEnvError, match="SLURM_JOB_GPUS"):
        gpu_indices({"SLURM_JOB_GPUS": "GPU-1234"})


def test_the_probe_writes_a_valid_record_within_its_bound(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,2",
           "HPCSCHED_PROBE_DIR": str(tmp_path / "spool"), "HPCSCHED_PROBE_SECONDS": "0.5",
           "HPCSCHED_PROBE_BACKEND": "cpu"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "hpcsched.probe"], env=env, capture_output=True,
                       text=True, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    files = list((tmp_path / "spool").iterdir())
    assert [f.name for f in files] == ["n1-42.json"]
    rec = parse_record(json.loads(files[0].read_text()))
    assert (rec.node, rec.job_id, rec.kind) == ("n1", "42", KIND_CPU)
    assert [g.index for g in rec.gpus] == ["0", "2"]
    assert all(g.unit == "GFLOP/s" and g.score > 0 and g.uuid == "" for g in rec.gpus)
    # 0.5 s of work shared by 2 GPUs (>= 0.2 s each); the interpreter's start on top
    assert all(0.2 <= g.seconds < 2 for g in rec.gpus)
    assert took < 15, took
    assert "GPU 0" in r.stderr and "GFLOP/s" in r.stderr


@pytest.mark.parametrize("env, status, message", [
    ({"SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0"}, 2, "SLURM_JOB_ID"),
    ({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0",
      "HPCSCHED_PROBE_SECONDS": "soon"}, 2, "HPCSCHED_PROBE_SECONDS"),
    ({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0",
      "HPCSCHED_PROBE_BACKEND": "tpu"}, 2, "HPCSCHED_PROBE_BACKEND"),
    ({"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}, 0, "no GPU on this node"),
])
def test_the_probe_refuses_a_bad_environment(tmp_path, env, status, message):
    env = {"PATH": os.environ["PATH"], "HPCSCHED_PROBE_DIR": str(tmp_path / "spool"), **env}
    r = subprocess.run([sys.executable, "-m", "hpcsched.probe"], env=env, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == status, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "spool").exists() or not list((tmp_path / "spool").iterdir())


def test_a_failed_benchmark_is_recorded_with_its_error(tmp_path):
    # the CUDA backend forced on a machine where torch sees no CUDA device
    env = {**os.environ, "SLURM_JOB_ID": "8", "SLURMD_NODENAME": "n2", "SLURM_JOB_GPUS": "0",
           "HPCSCHED_PROBE_DIR": str(tmp_path), "HPCSCHED_PROBE_BACKEND": "cuda",
           "CUDA_VISIBLE_DEVICES": ""}
    pytest.importorskip("torch", reason="the probe's CUDA backend imports torch; not installed here")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device; the test needs torch to see none")
    r = subprocess.run([sys.executable, "-m", "hpcsched.probe"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    rec = parse_record(json.loads((tmp_path / "n2-8.json").read_text()))
    assert rec.gpus == () and "no CUDA device" in rec.errors[0]


# -- the prolog script --------------------------------------------------------------------------


def test_the_prolog_probes_and_maps_the_jobs_gpus(tmp_path):
    _env_file(tmp_path)
    r, took = _run(PROLOG, _prolog_env(tmp_path))
    assert r.returncode == 0, r.stderr
    rec = parse_record(json.loads((tmp_path / "spool" / "n1-42.json").read_text()))
    assert [g.index for g in rec.gpus] == ["0", "2"] and rec.kind == KIND_CPU
    assert sorted(p.name for p in (tmp_path / "map").iterdir() if not p.name.startswith(".")) == ["0", "2"]
    assert (tmp_path / "map" / "0").read_text() == "42\n"
    assert "hpcsched-prolog: hpcsched-probe: job 42 on n1" in r.stderr
    assert took < 20


def _fake_python(tmp_path, body: str) -> Path:
    p = tmp_path / "fake-python"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return p


@pytest.mark.parametrize("body, extra, logged", [
    ("exit 3", "", "probe exited with status 3"),
    ("echo 'Traceback: boom' >&2; exit 1", "", "Traceback: boom"),
    ("exec sleep 60", "HPCSCHED_PROBE_TIMEOUT=1\n", "probe killed after 1 s"),
    ("exit 0", "HPCSCHED_PYTHON=/nonexistent/python\n", "probe exited with status 127"),
])
def test_the_prolog_exits_0_when_the_probe_fails(tmp_path, body, extra, logged):
    _env_file(tmp_path, extra, python=str(_fake_python(tmp_path, body)))
    r, took = _run(PROLOG, _prolog_env(tmp_path), timeout=30)
    assert r.returncode == 0
    assert logged in r.stderr, r.stderr
    assert took < 10, took                      # the bound holds: timeout(1), then -k 2
    assert (tmp_path / "map" / "2").read_text() == "42\n"   # the mapping is written first


@pytest.mark.parametrize("env_text", [
    "if then fi\n",                          # not sh: ignored, the defaults apply
    "exit 1\n",
])
def test_a_broken_env_file_does_not_fail_the_prolog(tmp_path, env_text):
    (tmp_path / "hpcsched.env").write_text(env_text)
    env = _prolog_env(tmp_path, HPCSCHED_PROBE="off", HPCSCHED_JOB_MAPPING_DIR=str(tmp_path / "map"))
    r, _ = _run(PROLOG, env)
    assert r.returncode == 0
    assert "fails when sourced by sh; ignored" in r.stderr
    assert (tmp_path / "map" / "0").read_text() == "42\n"


def test_the_environment_wins_over_the_env_file(tmp_path):
    _env_file(tmp_path, python="/nonexistent/python")
    env = _prolog_env(tmp_path, HPCSCHED_PYTHON=sys.executable,
                      HPCSCHED_PROBE_DIR=str(tmp_path / "elsewhere"))
    r, _ = _run(PROLOG, env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "elsewhere" / "n1-42.json").exists()
    assert not (tmp_path / "spool").exists()


def test_the_prolog_without_gpus_or_with_everything_off(tmp_path):
    _env_file(tmp_path, "HPCSCHED_PROBE=off\nHPCSCHED_JOB_MAPPING=off\n")
    r, _ = _run(PROLOG, _prolog_env(tmp_path))
    assert r.returncode == 0 and r.stderr == ""
    assert not (tmp_path / "spool").exists() and not (tmp_path / "map").exists()
    _env_file(tmp_path)
    r, _ = _run(PROLOG, _prolog_env(tmp_path, SLURM_JOB_GPUS=""))
    assert r.returncode == 0 and r.stderr == ""
    assert not (tmp_path / "spool").exists()


# -- the job mapping: prolog adds, epilog removes ---------------------------------------------


def _mapping(tmp_path) -> dict[str, str]:
    d = tmp_path / "map"
    return {p.name: p.read_text() for p in sorted(d.iterdir()) if not p.name.startswith(".")}


def test_the_job_mapping_follows_dcgm_exporters_convention(tmp_path):
    _env_file(tmp_path, "HPCSCHED_PROBE=off\n")
    assert _run(PROLOG, _prolog_env(tmp_path))[0].returncode == 0                       # job 42: 0,2
    assert _run(PROLOG, _prolog_env(tmp_path, SLURM_JOB_ID="43", SLURM_JOB_GPUS="2,3"))[0].returncode == 0
    assert _run(PROLOG, _prolog_env(tmp_path))[0].returncode == 0                       # again: no duplicate
    (tmp_path / "map" / "notes").write_text("42\n")                                     # not a GPU file
    assert _mapping(tmp_path) == {"0": "42\n", "2": "43\n42\n", "3": "43\n", "notes": "42\n"}

    r, _ = _run(EPILOG, _prolog_env(tmp_path))
    assert r.returncode == 0
    assert "job 42 on n1: GPUs 0,2" in r.stderr
    assert _mapping(tmp_path) == {"2": "43\n", "3": "43\n", "notes": "42\n"}
    r, _ = _run(EPILOG, _prolog_env(tmp_path, SLURM_JOB_ID="43", SLURM_JOB_GPUS=""))
    assert r.returncode == 0
    assert _mapping(tmp_path) == {"notes": "42\n"}


def test_the_epilog_exits_0_without_a_mapping_directory(tmp_path):
    _env_file(tmp_path)
    r, _ = _run(EPILOG, _prolog_env(tmp_path))
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize("script", [PROLOG, EPILOG])
def test_the_scripts_are_executable_posix_sh(script):
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/bin/sh\n")
    assert subprocess.run(["/bin/sh", "-n", str(script)]).returncode == 0
