"""hpcsub: bad input is a one-line error, exit 2, nothing submitted; good input renders and
submits a batch script through the real sbatch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcsched.job.sbatch_args import Geometry, UsageError
from hpcsched.job.submit import job_limits, validate_geometry
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.limits import JobLimits
from tests.conftest import EXAMPLE, cli

SCRIPT_OK = EXAMPLE


def _hpcsub(*args, cwd=None):
    return cli("hpcsub", *map(str, args), check=False, cwd=cwd)


def _nothing_created(control_dir: Path):
    mine = control_dir / current_user()      # the user's subtree may stay: it is not a job's
    for d in (control_dir, mine):
        entries = [p for p in d.glob("*") if p.name != "by-id" and p != mine] if d.exists() else []
        assert entries == [], f"job directories left behind: {entries}"
        assert not list((d / "by-id").glob("*")) if (d / "by-id").exists() else True


@pytest.mark.parametrize("args,message", [
    (["--hpcsched-frobnicate", "3", SCRIPT_OK], "unknown option --hpcsched-frobnicate"),
    (["--hpcsched-min-nodes", "3", "--hpcsched-max-nodes", "2", SCRIPT_OK],
     "minimum size 3 node(s) exceeds maximum 2"),
    (["-N", "2", "--hpcsched-min-nodes", "3", SCRIPT_OK], "raise it with --hpcsched-max-nodes"),
    (["-N", "4", "--hpcsched-max-nodes", "2", SCRIPT_OK], "outside hpcsched's limits"),
    (["--hpcsched-min-batch-size", "512", "--hpcsched-max-batch-size", "64", SCRIPT_OK],
     "exceeds --hpcsched-max-batch-size"),
    (["--hpcsched-batch-size", "0", SCRIPT_OK], "--hpcsched-batch-size: expected an integer >= 1, got '0'"),
    (["--hpcsched-batch-size", "lots", SCRIPT_OK], "--hpcsched-batch-size: expected an integer, got 'lots'"),
    (["--hpcsched-max-nodes", "abc", SCRIPT_OK], "--hpcsched-max-nodes: expected an integer, got 'abc'"),
    (["--hpcsched-lr-scaling", "cubic", SCRIPT_OK], "expected one of linear, sqrt, none"),
    (["--hpcsched-application", "my app", SCRIPT_OK], "expected 1-64 letters, digits"),
    (["--container-image", "img", SCRIPT_OK], "cannot tell whether 'img' is its value or the script"),
    (["--gres=gpu:4", "--hpcsched-max-gpus", "6", SCRIPT_OK], "not a multiple of the 4 GPUs per node"),
    (["/nonexistent/train.py"], "does not exist"),
    (["-N", "2"], "no training script"),
    (["--array=1-4", SCRIPT_OK], "job arrays (--array) are not supported"),
    (["-N", "2-4", SCRIPT_OK], "give one node count"),
    (["--gpus=8", SCRIPT_OK], "give GPUs per node"),
    (["--hpcsched-batch-size"], "--hpcsched-batch-size"),
])
def test_bad_input_is_one_line_exit_2_nothing_submitted(control_dir, args, message):
    r = _hpcsub(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcsub: error: "), r.stderr
    assert message in lines[0], lines[0]
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    _nothing_created(control_dir)


def test_non_python_script_is_refused(control_dir, tmp_path):
    s = tmp_path / "train.sh"
    s.write_text("#!/bin/bash\necho hi\n")
    r = _hpcsub(s)
    assert r.returncode == 2 and "is not a Python script" in r.stderr
    _nothing_created(control_dir)


def test_python_script_without_py_suffix_is_accepted_by_shebang(control_dir, tmp_path):
    s = tmp_path / "train"
    s.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    r = _hpcsub("--hpcsched-print-script", s)
    assert r.returncode == 0, r.stderr
    _nothing_created(control_dir)


def test_print_script_renders_directives_and_defaults(control_dir, tmp_path):
    s = tmp_path / "train.py"
    s.write_text("#!/usr/bin/env python3\n#SBATCH --time=01:00:00\n#SBATCH -p gpu  # the GPU partition\n"
                 "import torch\n#SBATCH --ignored\n")
    r = _hpcsub("-N", "2", "--gres=gpu:4", "--hpcsched-print-script", s, "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "#SBATCH --time=01:00:00" in text and "#SBATCH -p" in text
    assert "--ignored" not in text
    assert "#SBATCH --ntasks-per-node=4" in text and "#SBATCH --requeue" in text
    assert "-m hpcsched.launcher" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    _nothing_created(control_dir)


def test_user_ntasks_per_node_must_match_gpus(control_dir):
    r = _hpcsub("--gres=gpu:4", "--ntasks-per-node=2", SCRIPT_OK)
    assert r.returncode == 2 and "one worker per GPU" in r.stderr


@pytest.mark.slurm
def test_submission_prints_like_sbatch_and_records_the_spec(devcluster, control_dir, tmp_path, slurm_jobs):
    r = _hpcsub("-N", "1", "--gres=gpu:1", "--hold", f"--output={tmp_path}/o-%j.out",
                "--hpcsched-max-nodes", "2", SCRIPT_OK, "--epochs", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Submitted batch job ") and r.stdout.count("\n") == 1
    job_id = r.stdout.split()[-1]
    slurm_jobs.append(job_id)
    spec = JobDir.for_job(job_id).read_spec()
    assert (spec.nodes, spec.limits.workers_per_node, spec.limits.min_nodes, spec.limits.max_nodes) == (1, 1, 1, 2)
    assert spec.script_args == ("--epochs", "1") and spec.submit_dir == str(tmp_path)
    info = json.loads(cli("hpcsched", "status", "--json", job_id).stdout)["jobs"][0]
    assert info["state"] == "PENDING" and info["name"] == "digits_mlp.py"

    r = _hpcsub("--parsable", "--hold", "-N", "1", f"--output={tmp_path}/o-%j.out", SCRIPT_OK, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stdout
    slurm_jobs.append(r.stdout.strip())


@pytest.mark.slurm
def test_sbatch_refusal_passes_through_with_its_exit_code(devcluster, control_dir):
    r = _hpcsub("-p", "nosuchpartition", SCRIPT_OK)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "invalid partition" in r.stderr.lower()
    _nothing_created(control_dir)


def test_rendered_directives_survive_sbatch_quoting(control_dir, tmp_path):
    """A directive value with a backslash, quote or space comes back exactly (sbatch's rules)."""
    from hpcsched.job.sbatch_args import read_directives

    s = tmp_path / "train.py"
    s.write_text('#!/usr/bin/env python3\n#SBATCH --comment="a b\\\\c \\"q\\""\nprint(1)\n')
    (want,) = [t for t in read_directives(s.read_text()) if t.startswith("--comment")]
    assert want == '--comment=a b\\c "q"'
    r = _hpcsub("--hpcsched-print-script", s)
    assert r.returncode == 0, r.stderr
    assert want in read_directives(r.stdout)


# -- the pure parts of build_spec ------------------------------------------------------------------


@pytest.mark.parametrize("geo,expected", [
    (Geometry(), (1, 1)),
    (Geometry(nodes_min=2, nodes_max=2, gpus_per_node=4), (2, 4)),
    (Geometry(ntasks_per_node=3), (1, 3)),
    (Geometry(gpus_per_node=4, ntasks_per_node=4), (1, 4)),
    (Geometry(gpus_total=8, gpus_per_node=4), (1, 4)),
])
def test_validate_geometry(geo, expected):
    assert validate_geometry(geo) == expected


@pytest.mark.parametrize("opts,nodes,wpn,expected", [
    ({}, 2, 4, JobLimits(4, 1, 2, 256, 256, None, 256, "linear")),
    ({"batch-size": 100}, 1, 1, JobLimits(1, 1, 1, 100, 100, None, 100, "linear")),
    ({"max-batch-size": 512}, 1, 4, JobLimits(4, 1, 1, 128, 512, None, 128, "linear")),
    ({"min-batch-size": 64}, 1, 4, JobLimits(4, 1, 1, 64, 128, None, 128, "linear")),
    ({"min-gpus": 8, "max-gpus": 16}, 2, 4, JobLimits(4, 2, 4, 256, 256, None, 256, "linear")),
    ({"max-nodes": 3, "max-local-batch-size": 8, "lr-scaling": "sqrt"}, 1, 2,
     JobLimits(2, 1, 3, 64, 64, 8, 64, "sqrt")),
])
def test_job_limits_and_their_defaults(opts, nodes, wpn, expected):
    assert job_limits(opts, nodes, wpn) == expected


@pytest.mark.parametrize("opts,nodes,wpn,message", [
    ({"min-nodes": 2, "min-gpus": 8}, 2, 4, "give --hpcsched-min-nodes or --hpcsched-min-gpus, not both"),
    ({"max-gpus": 6}, 2, 4, "--hpcsched-max-gpus=6 is not a multiple of the 4 GPUs per node"),
    ({"min-nodes": 2, "batch-size": 4}, 2, 4,
     "--hpcsched-max-batch-size=4 is smaller than the 8 GPUs of the smallest allowed size"),
    ({"batch-size": 64, "max-batch-size": 32}, 1, 1, "batch size 64 is outside [32, 32]"),
])
def test_job_limits_refuses(opts, nodes, wpn, message):
    with pytest.raises(UsageError) as exc:
        job_limits(opts, nodes, wpn)
    assert message in str(exc.value)


@pytest.mark.parametrize("opts, wpn, min_nodes, min_gpus", [
    ({"min-gpus": 2}, 4, 1, 2),     # half a node: whole-node sizes stop at 1 node, layouts at 2
    ({"min-gpus": 6}, 4, 2, 6),     # between whole nodes
    ({"min-gpus": 8}, 4, 2, 8),     # a multiple: nodes only
])
def test_a_gpu_minimum_below_or_between_whole_nodes_is_kept(opts, wpn, min_nodes, min_gpus):
    from dataclasses import replace

    from tests.test_launcher import _spec

    lim = job_limits({**opts, "max-nodes": 3}, 2, wpn)
    assert (lim.min_nodes, lim.min_gpus) == (min_nodes, min_gpus)
    assert lim.min_gpu_count == (None if min_gpus % wpn == 0 else min_gpus)
    spec = replace(_spec("u"), limits=lim)   # spec.json keeps it ("min_gpus"), or leaves it out
    assert JobSpec.from_json(spec.to_json()) == spec
    assert ("min_gpus" in spec.to_json()) == (lim.min_gpu_count is not None)
