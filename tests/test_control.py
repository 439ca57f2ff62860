"""The control-file protocol: valid round trips, and malformed or foreign files refused."""

import json
import os
from dataclasses import asdict, replace

import pytest

from hpcsched.protocol import files as ctl


def _control(**kw):
    base = dict(job_uid="abc123", generation=1, action="continue", nodes=2, workers_per_node=2,
                global_batch_size=64, local_batch_size=16, accumulation_steps=1, lr_scale=1.0,
                issued_at=1.0)
    base.update(kw)
    return ctl.Control(**base)


def test_round_trip(tmp_path):
    p = tmp_path / "control.json"
    ctl.write_control(p, _control(reason="test"))
    got = ctl.read_control(p, "abc123")
    assert got == _control(reason="test")
    assert got.world_size == 4
    assert not list(tmp_path.glob(".*tmp")), "temporary file left behind"


def test_absent_file_is_none(tmp_path):
    assert ctl.read_control(tmp_path / "control.json") is None
    assert ctl.read_ack(tmp_path / "ack.json") is None


def test_generation_only_grows(tmp_path):
    p = tmp_path / "control.json"
    ctl.write_control(p, _control(generation=3))
    with pytest.raises(ctl.ProtocolError, match="generations only grow"):
        ctl.write_control(p, _control(generation=3))
    with pytest.raises(ctl.ProtocolError, match="generations only grow"):
        ctl.write_control(p, _control(generation=2))
    ctl.write_control(p, _control(generation=4))
    assert ctl.read_control(p).generation == 4


@pytest.mark.parametrize("content,message", [
    ("", "not valid JSON"),
    ("{\"schema\": \"hpcsched.control/1\", ", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("{\"schema\": \"hpcsched.control/2\"}", "schema 'hpcsched.control/2'"),
    ("{\"generation\": 1}", "schema None"),
])
def test_malformed_files_are_refused(tmp_path, content, message):
    p = tmp_path / "control.json"
    p.write_text(content)
    with pytest.raises(ctl.ProtocolError, match=message):
        ctl.read_control(p, "abc123")


@pytest.mark.parametrize("field,value,message", [
    ("generation", 0, "'generation' must be >= 1"),
    ("generation", "7", "'generation' must be int"),
    ("generation", True, "'generation' must be int"),
    ("action", "explode", "action 'explode' is not one of"),
    ("nodes", -1, "'nodes' must be >= 1"),
    ("lr_scale", 0, "'lr_scale' must be > 0"),
    ("global_batch_size", 65, "global_batch_size 65 !="),
])
def test_invalid_values_are_refused(tmp_path, field, value, message):
    p = tmp_path / "control.json"
    obj = asdict(_control())
    obj[field] = value
    p.write_text(json.dumps(obj))
    with pytest.raises(ctl.ProtocolError, match=message):
        ctl.read_control(p, "abc123")


def test_missing_field_is_refused(tmp_path):
    p = tmp_path / "control.json"
    obj = asdict(_control())
    del obj["nodes"]
    p.write_text(json.dumps(obj))
    with pytest.raises(ctl.ProtocolError, match="missing field 'nodes'"):
        ctl.read_control(p, "abc123")


def test_foreign_job_file_is_refused(tmp_path):
    p = tmp_path / "control.json"
    ctl.write_control(p, _control())
    with pytest.raises(ctl.ProtocolError, match="not this job"):
        ctl.read_control(p, "someoneelse")


def test_unknown_extra_keys_are_tolerated(tmp_path):
    """Forward compatibility within a schema version: new optional fields are ignored."""
    p = tmp_path / "control.json"
    obj = asdict(_control())
    obj["future_field"] = {"x": 1}
    p.write_text(json.dumps(obj))
    assert ctl.read_control(p, "abc123").generation == 1


def test_broken_file_on_disk_is_replaced_not_trusted(tmp_path):
    p = tmp_path / "control.json"
    p.write_text("garbage")
    ctl.write_control(p, _control(generation=1))
    assert ctl.read_control(p).generation == 1


def test_ack_round_trip_and_validation(tmp_path):
    p = tmp_path / "ack.json"
    a = ctl.Ack(job_uid="abc123", generation=0, state="applied", world_size=4, nodes=2,
                global_batch_size=64, local_batch_size=16, accumulation_steps=1, step=0, time=1.0)
    ctl.write_ack(p, a)
    assert ctl.read_ack(p, "abc123") == a
    with pytest.raises(ctl.ProtocolError, match="state 'done'"):
        ctl.write_ack(p, replace(a, state="done"))


def test_atomic_write_survives_failure(tmp_path, monkeypatch):
    p = tmp_path / "control.json"
    ctl.write_control(p, _control(generation=1))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        ctl.write_control(p, _control(generation=2))
    monkeypatch.undo()
    assert ctl.read_control(p).generation == 1
    assert [f.name for f in tmp_path.iterdir()] == ["control.json"]


def test_expand_hostlist_matches_slurm_forms():
    from hpcsched.slurm import expand_hostlist

    assert expand_hostlist("n[1-3,5]") == ["n1", "n2", "n3", "n5"]
    assert expand_hostlist("gpu[08-10],login1") == ["gpu08", "gpu09", "gpu10", "login1"]
    assert expand_hostlist("n1") == ["n1"] and expand_hostlist("") == []
    assert expand_hostlist("a[1-2]-ib,b3") == ["a1-ib", "a2-ib", "b3"]
