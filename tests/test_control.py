"""The control-file protocol: valid round trips, and malformed or foreign files refused."""

import json
import logging
import os
from dataclasses import asdict, replace

import pytest

from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import AckState, ControlAction, LauncherPhase


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
    assert ctl.read_launcher_state(tmp_path / "launcher.json") is None


def test_the_vocabulary_is_the_enums():
    assert ctl.ACTIONS == ("continue", "checkpoint-and-shrink", "checkpoint-and-requeue", "reform")
    assert ctl.ACK_STATES == ("applied", "checkpointed", "rejected", "stopped")
    assert ctl.LAUNCHER_PHASES == ("running", "resizing", "awaiting-requeue", "requeued", "stopped",
                                   "finished", "failed")


def test_read_gives_enum_members(tmp_path):
    ctl.write_control(tmp_path / "control.json", _control(action="checkpoint-and-shrink"))
    assert ctl.read_control(tmp_path / "control.json").action is ControlAction.CHECKPOINT_AND_SHRINK
    ctl.write_ack(tmp_path / "ack.json", _ack())
    assert ctl.read_ack(tmp_path / "ack.json").state is AckState.APPLIED


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
    ("ack_by", -1.0, "'ack_by' must be >= 0"),
    ("ack_by", "soon", "'ack_by' must be int/float"),
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


def test_files_written_before_the_layout_field_are_read(tmp_path):
    """A control or ack written by an hpcsched older than extension allocations (no ``layout``):
    read with an empty layout, so a daemon upgraded under running jobs still reads them."""
    for name, obj, read in (("control.json", asdict(_control()), ctl.read_control),
                            ("ack.json", asdict(_ack()), ctl.read_ack)):
        del obj["layout"]
        p = tmp_path / name
        p.write_text(json.dumps(obj))
        assert read(p, "abc123").layout == {}


def test_files_written_before_the_ack_by_field_have_no_deadline(tmp_path):
    """A control without ``ack_by`` (hpcsched before it): read as 0, no deadline; with one it
    round-trips."""
    p = tmp_path / "control.json"
    obj = asdict(_control())
    del obj["ack_by"]
    p.write_text(json.dumps(obj))
    assert ctl.read_control(p, "abc123").ack_by == 0.0
    ctl.write_control(p, _control(generation=2, ack_by=181.0))
    assert ctl.read_control(p, "abc123").ack_by == 181.0


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


def _ack(**kw):
    base = {"job_uid": "abc123", "generation": 0, "state": "applied", "world_size": 4, "nodes": 2,
            "global_batch_size": 64, "local_batch_size": 16, "accumulation_steps": 1, "step": 0,
            "time": 1.0}
    base.update(kw)
    return ctl.Ack(**base)


def test_ack_round_trip_and_validation(tmp_path):
    p = tmp_path / "ack.json"
    a = _ack()
    ctl.write_ack(p, a)
    assert ctl.read_ack(p, "abc123") == a
    with pytest.raises(ctl.ProtocolError, match="state 'done'"):
        ctl.write_ack(p, replace(a, state="done"))


# ------------------------------------------------------------------------ launcher.json

def _launcher(**kw):
    base = {"job_uid": "abc123", "job_id": "17", "phase": "running", "launches": 1, "resizes": 0,
            "restarts": 0, "time": 1.0, "nodelist": "n[1-2]", "generation": 0, "nodes": 2,
            "world_size": 4, "global_batch_size": 64}
    base.update(kw)
    return ctl.LauncherState(**base)


@pytest.mark.parametrize("state", [
    _launcher(),
    _launcher(phase="resizing", generation=None, nodes=None, world_size=None,
              global_batch_size=None, target_nodes=1),
    _launcher(phase="awaiting-requeue", target_nodes=3, launches=4, resizes=2, restarts=1),
    _launcher(phase="finished", exit_code=0),
    _launcher(phase="failed", exit_code=-9),
    _launcher(phase="failed", generation=None, error="cannot run on 9 node(s)"),
])
def test_launcher_state_round_trip(tmp_path, state):
    p = tmp_path / "launcher.json"
    ctl.write_launcher_state(p, state)
    got = ctl.read_launcher_state(p, "abc123")
    assert got == state and isinstance(got.phase, LauncherPhase)
    assert json.loads(p.read_text())["schema"] == "hpcsched.launcher/1"
    assert got.phase.in_transition == (state.phase in ("resizing", "awaiting-requeue"))


@pytest.mark.parametrize("content,message", [
    # what launchers wrote before launcher.json had a schema (no schema, no job_uid)
    ({"job_id": "17", "launches": 1, "resizes": 0, "restarts": 0, "phase": "running",
      "time": 1.0, "nodelist": "n1"}, "schema None is not 'hpcsched.launcher/1'"),
    ({**asdict(_launcher()), "schema": "hpcsched.launcher/2"}, "schema 'hpcsched.launcher/2'"),
    ({**asdict(_launcher()), "job_uid": "other"}, "not this job"),
    ({**asdict(_launcher()), "phase": "dancing"}, "phase 'dancing' is not one of running,"),
    ({**asdict(_launcher()), "launches": -1}, "'launches' must be >= 0"),
    ({**asdict(_launcher()), "restarts": "1"}, "'restarts' must be int"),
    ({**asdict(_launcher()), "time": None}, "'time' must be int/float"),
    ({**asdict(_launcher()), "target_nodes": 1.5}, "'target_nodes' must be int"),
    ({**asdict(_launcher()), "exit_code": "0"}, "'exit_code' must be int"),
    ({k: v for k, v in asdict(_launcher()).items() if k != "phase"}, "missing field 'phase'"),
])
def test_invalid_launcher_state_is_refused(tmp_path, content, message):
    p = tmp_path / "launcher.json"
    p.write_text(json.dumps(content))
    with pytest.raises(ctl.ProtocolError, match=message):
        ctl.read_launcher_state(p, "abc123")


def test_an_invalid_launcher_state_is_not_written(tmp_path):
    with pytest.raises(ctl.ProtocolError, match="phase 'idle'"):
        ctl.write_launcher_state(tmp_path / "launcher.json", _launcher(phase="idle"))
    assert not (tmp_path / "launcher.json").exists()


@pytest.mark.parametrize("content", [
    '{"job_id": "17", "launches": 1, "phase": "resizing", "time": 1.0}',   # an older launcher's
    "{not json",
])
def test_job_dir_reads_an_untrusted_launcher_state_as_unknown(tmp_path, caplog, content):
    jd = JobDir.create(tmp_path)
    assert jd.read_launcher_state() is None                     # no file yet: nothing logged
    assert not caplog.records
    jd.launcher_path.write_text(content)
    with caplog.at_level(logging.WARNING):
        assert jd.read_launcher_state() is None
    assert "launcher state unknown" in caplog.text
    ctl.write_launcher_state(jd.launcher_path, _launcher(job_uid=jd.uid, phase="resizing"))
    assert jd.read_launcher_state().phase is LauncherPhase.RESIZING


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
