"""A job's limits (JobLimits) and its spec (JobSpec, spec.json): validation, helpers, and the
file format, which must stay exactly what hpcsub has always written (queued jobs keep old files)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.protocol.files import ProtocolError
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.limits import JobLimits

GOOD = dict(workers_per_node=4, min_nodes=1, max_nodes=3, min_batch_size=128, max_batch_size=512,
            max_local_batch_size=None, base_batch_size=256, lr_scaling="sqrt")

# spec.json as hpcsub wrote it before JobLimits existed (commit e940ae4), byte for byte
OLD_SPEC_JSON = (
    '{"job_uid": "abc", "script": "/x/t.py", "script_args": ["--a"], "python": "/usr/bin/python3", '
    '"submit_dir": "/x", "sbatch_args": ["-N", "2"], "nodes": 2, "workers_per_node": 4, '
    '"min_nodes": 1, "max_nodes": 3, "batch_size": 256, "min_batch_size": 128, '
    '"max_batch_size": 512, "max_local_batch_size": null, "lr_scaling": "sqrt", '
    '"checkpoint_dir": "/x/c", "checkpoint_interval": 5.0, "record_samples": true, "user": "u", '
    '"created_at": 1.5, "schema": "hpcsched.spec/1", "extra": {"k": [1]}}'
)


def test_good_limits_and_their_gpu_range():
    lim = JobLimits(**GOOD)
    assert (lim.min_gpus, lim.max_gpus) == (4, 12)


@pytest.mark.parametrize("change,message", [
    (dict(workers_per_node=0), "workers_per_node must be an integer >= 1, got 0"),
    (dict(min_nodes=0), "min_nodes must be an integer >= 1"),
    (dict(max_nodes=2.0), "max_nodes must be an integer >= 1, got 2.0"),
    (dict(min_batch_size=True), "min_batch_size must be an integer >= 1, got True"),
    (dict(max_local_batch_size=0), "max_local_batch_size must be an integer >= 1"),
    (dict(base_batch_size="256"), "base_batch_size must be an integer >= 1"),
    (dict(lr_scaling="cubic"), "lr_scaling 'cubic' is not one of linear, sqrt, none"),
    (dict(min_nodes=4), "min_nodes 4 exceeds max_nodes 3"),
    (dict(min_batch_size=1024, base_batch_size=1024), "min_batch_size 1024 exceeds max_batch_size 512"),
    (dict(base_batch_size=64), "base_batch_size 64 is outside [128, 512]"),
    (dict(base_batch_size=600), "base_batch_size 600 is outside [128, 512]"),
    (dict(min_nodes=2, workers_per_node=8, min_batch_size=8, base_batch_size=8, max_batch_size=8),
     "max_batch_size 8 is smaller than the 16 GPUs of the smallest size"),
])
def test_limits_that_break_a_rule_are_refused_by_name(change, message):
    with pytest.raises(ValueError) as exc:
        JobLimits(**{**GOOD, **change})
    assert message in str(exc.value)


@pytest.mark.parametrize("nodes,allowed", [(0, False), (1, True), (3, True), (4, False)])
def test_allows_nodes(nodes, allowed):
    assert JobLimits(**GOOD).allows_nodes(nodes) is allowed


@pytest.mark.parametrize("batch,allowed", [(127, False), (128, True), (512, True), (513, False)])
def test_allows_batch_size(batch, allowed):
    assert JobLimits(**GOOD).allows_batch_size(batch) is allowed


@pytest.mark.parametrize("gpus,nodes", [(4, 1), (8, 2), (12, 3), (0, 0)])
def test_nodes_for_gpus(gpus, nodes):
    assert JobLimits(**GOOD).nodes_for_gpus(gpus) == nodes


def test_nodes_for_gpus_refuses_a_partial_node():
    with pytest.raises(ValueError, match="6 GPUs is not a multiple of the 4 GPUs per node"):
        JobLimits(**GOOD).nodes_for_gpus(6)


@pytest.mark.parametrize("requested,nodes,max_local", [
    (256, 1, None), (256, 2, None), (1000, 3, None), (10, 3, None), (300, 2, 16), (512, 1, 32),
])
def test_fit_batch_is_batching_fit_batch_with_the_limits(requested, nodes, max_local):
    lim = JobLimits(**{**GOOD, "max_local_batch_size": max_local})
    got = lim.fit_batch(requested, nodes)
    assert got == fit_batch(requested, nodes * 4, min_global=128, max_global=512,
                            max_local_batch_size=max_local)
    assert 128 <= got.global_batch_size <= 512 and got.world_size == nodes * 4
    if max_local is not None:
        assert got.local_batch_size <= max_local


def test_fit_batch_raises_when_nothing_fits():
    lim = JobLimits(**{**GOOD, "max_nodes": 200})
    with pytest.raises(BatchSizeError):
        lim.fit_batch(512, 200)  # 800 GPUs, at most 512 samples
    assert lim.fit_batch(512, 128) == BatchConfig(512, 1, 1)


@pytest.mark.parametrize("rule,batch,scale", [
    ("linear", 512, 2.0), ("linear", 128, 0.5), ("sqrt", 512, 2 ** 0.5), ("none", 512, 1.0),
])
def test_lr_scale_is_relative_to_the_base_batch(rule, batch, scale):
    assert JobLimits(**{**GOOD, "lr_scaling": rule}).lr_scale(batch) == pytest.approx(scale)


def test_limits_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobLimits(**GOOD).min_nodes = 2


# -- JobSpec / spec.json -----------------------------------------------------------------------


def test_old_spec_json_loads_and_writes_back_byte_for_byte():
    spec = JobSpec.from_json(json.loads(OLD_SPEC_JSON))
    assert spec.limits == JobLimits(**GOOD)
    assert json.dumps(spec.to_json()) == OLD_SPEC_JSON
    assert (spec.nodes, spec.script_args, spec.sbatch_args) == (2, ("--a",), ("-N", "2"))
    assert (spec.checkpoint_interval, spec.record_samples, spec.extra) == (5.0, True, {"k": [1]})


def test_flat_keys_read_into_the_limits():
    spec = JobSpec.from_json(json.loads(OLD_SPEC_JSON))
    lim = spec.limits
    assert (lim.workers_per_node, lim.min_nodes, lim.max_nodes, lim.base_batch_size,
            lim.min_batch_size, lim.max_batch_size, lim.max_local_batch_size,
            lim.lr_scaling, lim.min_gpus, lim.max_gpus) == (4, 1, 3, 256, 128, 512, None, "sqrt", 4, 12)
    # the limits are read from spec.limits only: no flat aliases beside it
    assert not any(hasattr(spec, n) for n in ("workers_per_node", "min_nodes", "batch_size", "max_gpus"))


def test_spec_round_trips_through_a_job_directory(tmp_path):
    jd = JobDir.create(tmp_path)
    spec = JobSpec(job_uid=jd.uid, script="/s/train.py", script_args=(), python="python3",
                   submit_dir="/s", sbatch_args=("--gres=gpu:2",), nodes=1,
                   limits=JobLimits(2, 1, 2, 16, 64, 8, 32, "linear"), checkpoint_dir="/c")
    jd.write_spec(spec)
    assert jd.read_spec() == spec
    assert json.loads(jd.spec_path.read_text())["batch_size"] == 32


def test_the_application_is_written_only_when_given_and_names_the_job_for_the_daemon(tmp_path):
    from hpcsched.daemon.views import application_of

    jd = JobDir.create(tmp_path)
    spec = JobSpec(job_uid=jd.uid, script="/s/emulated.py", script_args=(), python="python3",
                   submit_dir="/s", sbatch_args=(), nodes=1,
                   limits=JobLimits(2, 1, 2, 16, 64, 8, 32, "linear"), checkpoint_dir="/c")
    jd.write_spec(spec)
    assert "application" not in json.loads(jd.spec_path.read_text())
    assert application_of(jd.read_spec()) == "emulated"
    jd.write_spec(dataclasses.replace(spec, application="cifar10"))
    assert json.loads(jd.spec_path.read_text())["application"] == "cifar10"
    assert application_of(jd.read_spec()) == "cifar10"


def test_unknown_keys_in_spec_json_are_ignored():
    obj = {**json.loads(OLD_SPEC_JSON), "added_later": 1}
    assert JobSpec.from_json(obj).limits == JobLimits(**GOOD)


def _edited(**change):
    obj = json.loads(OLD_SPEC_JSON)
    for k, v in change.items():
        if v is _DROP:
            del obj[k]
        else:
            obj[k] = v
    return obj


_DROP = object()


@pytest.mark.parametrize("obj,message", [
    ([], "not an hpcsched job spec"),
    (_edited(schema="hpcsched.spec/0"), "not an hpcsched job spec"),
    (_edited(lr_scaling=_DROP), "spec.json: missing lr_scaling"),
    (_edited(batch_size=_DROP, min_nodes=_DROP), "spec.json: missing min_nodes, batch_size"),
    (_edited(min_nodes=5), "spec.json: min_nodes 5 exceeds max_nodes 3"),
    (_edited(batch_size=1000), "spec.json: base_batch_size 1000 is outside [128, 512]"),
    (_edited(job_uid=_DROP), "spec.json: "),
])
def test_bad_spec_json_is_a_protocol_error(obj, message):
    with pytest.raises(ProtocolError) as exc:
        JobSpec.from_json(obj)
    assert message in str(exc.value)


@pytest.mark.parametrize("text,message", [(None, "missing"), ("{", "not valid JSON")])
def test_read_spec_of_a_missing_or_broken_file(tmp_path, text, message):
    jd = JobDir.create(tmp_path)
    if text is not None:
        jd.spec_path.write_text(text)
    with pytest.raises(ProtocolError, match=message):
        jd.read_spec()


@pytest.mark.parametrize("plant", ["fifo", "link", "huge"])
def test_read_spec_is_bounded_like_every_job_file(control_dir, plant):
    d = JobDir.create(control_dir)
    if plant == "fifo":
        os.mkfifo(d.spec_path)          # must not block hpcsched status or resize
    elif plant == "link":
        d.spec_path.symlink_to("/etc/passwd")
    else:
        d.spec_path.write_text("[" * 10 + " " * (2 << 20))
    with pytest.raises(ProtocolError):
        d.read_spec()
