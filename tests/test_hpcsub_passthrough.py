"""hpcsub (issue 34): options it does not know reach sbatch unchanged, from the command line and
from #SBATCH lines; its own options' bad values are one-line errors with exit status 2.

Everything runs in this process with a stand-in for sbatch put in place of ``subprocess`` in
``hpcsched.job.submit`` only: no real sbatch is ever run.
"""

from __future__ import annotations

import io
import subprocess
import types
from pathlib import Path

import pytest

from hpcsched.job import submit as submit_mod
from hpcsched.job.sbatch_args import read_directives
from hpcsched.job.submit import OPTIONS, submit
from hpcsched.protocol.jobdir import JobDir, current_user


class FakeSbatch:
    """Records the sbatch command line; answers like ``sbatch --parsable`` (or refuses)."""

    def __init__(self, stdout: str = "4242\n", rc: int = 0):
        self.stdout, self.rc = stdout, rc
        self.cmds: list[list[str]] = []

    def popen(self, cmd, stdout, text):  # sbatch's stderr is not captured: the user sees it
        assert stdout is subprocess.PIPE and text
        self.cmds.append(list(cmd))
        return types.SimpleNamespace(stdout=io.StringIO(self.stdout), wait=lambda: self.rc)


@pytest.fixture
def sbatch(monkeypatch, control_dir):
    fake = FakeSbatch()
    monkeypatch.setattr(submit_mod, "subprocess",
                        types.SimpleNamespace(Popen=fake.popen, PIPE=subprocess.PIPE))
    return fake


@pytest.fixture
def script(tmp_path) -> Path:
    s = tmp_path / "train.py"
    s.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    return s


def _job_dirs(control_dir: Path) -> list[Path]:
    mine = control_dir / current_user()
    return [p for p in mine.glob("*") if p.name != "by-id"] if mine.exists() else []


def _one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcsub: error: "), err
    return lines[0]


# -- pass-through from the command line -------------------------------------------------------


def test_unknown_long_options_reach_sbatch_unchanged(sbatch, script, capsys, control_dir):
    argv = ["--container-image=nvcr.io/nvidia/pytorch:24.01-py3", "--container-mount-home",
            "-N", "2", "--gres=gpu:4", "--tres-per-task=gres/gpu:1", "--container-mounts=/a:/b,/c",
            "--hpcsched-max-nodes", "3", "--container-writable", "--", str(script), "--lr", "0.1"]
    assert submit(argv) == 0
    (cmd,) = sbatch.cmds
    (job,) = _job_dirs(control_dir)
    assert cmd == ["sbatch", "--parsable", "--container-image=nvcr.io/nvidia/pytorch:24.01-py3",
                   "--container-mount-home", "-N", "2", "--gres=gpu:4",
                   "--tres-per-task=gres/gpu:1", "--container-mounts=/a:/b,/c",
                   "--container-writable", "--", str(job / "job.sbatch")]
    assert capsys.readouterr().out == "Submitted batch job 4242\n"
    # what hpcsub reads it still reads: 2 nodes of 4 GPUs, the hpcsched limit
    spec = JobDir.for_job("4242").read_spec()
    assert (spec.nodes, spec.limits.workers_per_node, spec.limits.max_nodes) == (2, 4, 3)
    assert spec.script_args == ("--lr", "0.1")
    assert "--container-image=nvcr.io/nvidia/pytorch:24.01-py3" in spec.sbatch_args


def test_sbatch_refusing_an_unknown_option_is_its_answer(sbatch, script, capsys, control_dir):
    sbatch.stdout, sbatch.rc = "", 255  # sbatch: unrecognized option '--bogus' (on its stderr)
    assert submit(["--bogus=1", "-N", "1", str(script)]) == 255
    assert sbatch.cmds[0][2] == "--bogus=1"
    assert capsys.readouterr().out == ""
    assert _job_dirs(control_dir) == []  # nothing was submitted


@pytest.mark.parametrize("argv, word", [
    (["--container-image", "img"], "img"),
    (["--container-mount-home"], "SCRIPT"),
])
def test_an_unknown_option_before_a_word_is_refused(sbatch, script, capsys, control_dir, argv, word):
    word = str(script) if word == "SCRIPT" else word
    assert submit([*argv, str(script)]) == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"hpcsub: error: {argv[0]} {word!r}: hpcsub does not know {argv[0]}")
    assert f"write {argv[0]}=VALUE, or put -- before the script" in line
    assert sbatch.cmds == [] and _job_dirs(control_dir) == []


# -- pass-through from #SBATCH lines ------------------------------------------------------------


def test_unknown_directives_reach_sbatch_in_the_rendered_script(sbatch, tmp_path, capsys, control_dir):
    s = tmp_path / "train.py"
    s.write_text("#!/usr/bin/env python3\n"
                 "#SBATCH --container-image nvcr.io/x:1 --gres=gpu:2\n"
                 "#SBATCH --container-mount-home\n"
                 '#SBATCH --comment="a b" --tres-per-task=gres/gpu:1\n'
                 "#SBATCH -N 2\n"
                 "import torch\n")
    assert submit(["--hpcsched-max-nodes=4", str(s)]) == 0
    (job,) = _job_dirs(control_dir)
    rendered = read_directives((job / "job.sbatch").read_text())
    user = ("--container-image", "nvcr.io/x:1", "--gres=gpu:2", "--container-mount-home",
            "--comment=a b", "--tres-per-task=gres/gpu:1", "-N", "2")
    start = rendered.index("--container-image")
    assert rendered[start:start + len(user)] == user
    assert sbatch.cmds[0][-2:] == ["--", str(job / "job.sbatch")]
    spec = JobDir.for_job("4242").read_spec()
    assert (spec.nodes, spec.limits.workers_per_node, spec.limits.max_nodes) == (2, 2, 4)


def test_print_script_keeps_unknown_directives(sbatch, tmp_path, capsys):
    s = tmp_path / "train.py"
    s.write_text("#!/usr/bin/env python3\n#SBATCH --container-image=img\n#SBATCH --x11\n")
    assert submit(["--hpcsched-print-script", "--tres-per-task=gres/gpu:1", str(s)]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --container-image=img\n#SBATCH --x11\n" in text
    assert sbatch.cmds == []


# -- hpcsub's own options: one-line errors ----------------------------------------------------

_POSITIVE_INTS = sorted(n for n, o in OPTIONS.items() if o.parse is submit_mod._positive_int)


def test_the_integer_options_are_all_checked_here():
    assert _POSITIVE_INTS == ["batch-size", "max-batch-size", "max-gpus", "max-local-batch-size",
                              "max-nodes", "min-batch-size", "min-gpus", "min-nodes"]


@pytest.mark.parametrize("name", _POSITIVE_INTS)
@pytest.mark.parametrize("value, expected", [
    ("abc", "expected an integer, got 'abc'"),
    ("1.5", "expected an integer, got '1.5'"),
    ("", "expected an integer, got ''"),
    ("-1", "expected an integer, got '-1'"),
    (" 4", "expected an integer, got ' 4'"),
    ("4_0", "expected an integer, got '4_0'"),
    ("0", "expected an integer >= 1, got '0'"),
])
def test_bad_integers(sbatch, script, capsys, control_dir, name, value, expected):
    assert submit([f"--hpcsched-{name}={value}", str(script)]) == 2
    assert _one_line_error(capsys) == f"hpcsub: error: --hpcsched-{name}: {expected}"
    assert sbatch.cmds == [] and _job_dirs(control_dir) == []


@pytest.mark.parametrize("value, expected", [
    ("soon", "expected a number, got 'soon'"),
    ("", "expected a number, got ''"),
    ("-1", "expected a number >= 0, got '-1'"),
    ("nan", "expected a number >= 0, got 'nan'"),
    ("inf", "expected a number >= 0, got 'inf'"),
])
def test_bad_checkpoint_interval(sbatch, script, capsys, control_dir, value, expected):
    assert submit(["--hpcsched-checkpoint-interval", value, str(script)]) == 2
    assert _one_line_error(capsys) == f"hpcsub: error: --hpcsched-checkpoint-interval: {expected}"
    assert sbatch.cmds == []


@pytest.mark.parametrize("argv, expected", [
    (["--hpcsched-lr-scaling=cubic"], "--hpcsched-lr-scaling: expected one of linear, sqrt, none"),
    (["--hpcsched-application=my app"], "--hpcsched-application: expected 1-64 letters, digits, "
                                        "'-', '_' or '.', got 'my app'"),
    (["--hpcsched-python="], "--hpcsched-python: expected a path, got ''"),
    (["--hpcsched-checkpoint-dir="], "--hpcsched-checkpoint-dir: expected a path, got ''"),
])
def test_other_bad_values(sbatch, script, capsys, argv, expected):
    assert submit([*argv, str(script)]) == 2
    assert _one_line_error(capsys).startswith(f"hpcsub: error: {expected}")


def test_good_values_still_work(sbatch, script, capsys):
    assert submit(["-N", "2", "--hpcsched-max-nodes", "4", "--hpcsched-min-nodes=1",
                   "--hpcsched-batch-size", "64", "--hpcsched-checkpoint-interval=2.5",
                   str(script)]) == 0
    spec = JobDir.for_job("4242").read_spec()
    assert (spec.limits.min_nodes, spec.limits.max_nodes, spec.limits.base_batch_size) == (1, 4, 64)
    assert spec.checkpoint_interval == 2.5
