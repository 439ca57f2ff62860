"""Extension allocations, the pure parts: layouts, the plan from a layout, the tag, the
``extensions.json`` file, forms, the survivors rule, and what an extension is submitted with.
(The mechanism against the real Slurm and torch.distributed: tests/test_extensions_slurm.py.)
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from hpcsched.job import extension as ex
from hpcsched.job import reform as rf
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import (
    Extension,
    Extensions,
    ExtensionState,
    extension_comment,
    format_layout,
    parse_extension_comment,
    parse_layout,
    read_extensions,
    write_extensions,
)
from hpcsched.protocol.jobdir import JobDir

S, J = ExtensionState.SUBMITTED, ExtensionState.JOINED


def _ext(job_id: str, node: str, gpus: int, state=J) -> Extension:
    return Extension(job_id, node, gpus, 1, state, 100.0, 100.0)


# ------------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("text, layout", [
    ("n1:4", {"n1": 4}), ("n1:4,n2:2", {"n1": 4, "n2": 2}), (" n1:4 , gpu-a.1:1", {"n1": 4, "gpu-a.1": 1}),
])
def test_layouts_parse_and_format(text, layout):
    assert parse_layout(text) == layout
    assert parse_layout(format_layout(layout)) == layout


@pytest.mark.parametrize("text, message", [
    ("n1", "is not NODE:GPUS"), ("n1:x", "is not NODE:GPUS"), ("n1:4,n1:2", "named twice"),
    ("n1:0", "must be >= 1"), ("n[1-2]:4", "is not a node name"), (":4", "is not a node name"),
    ("n1:-1", "is not NODE:GPUS"),
])
def test_bad_layouts_are_refused_with_the_reason(text, message):
    with pytest.raises(ctl.ProtocolError, match=message.replace("[", r"\[")):
        parse_layout(text)


# ---------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("primary, active, target, keep, release, add", [
    ({"n1": 4}, [], {"n1": 4, "n2": 2}, (), (), {"n2": 2}),                  # grow onto n2
    ({"n1": 4}, [_ext("7", "n2", 2)], {"n1": 4, "n2": 2, "n3": 2}, ("7",), (), {"n3": 2}),
    ({"n1": 4}, [_ext("7", "n2", 2), _ext("8", "n3", 2)], {"n1": 4, "n3": 2}, ("8",), ("7",), {}),
    ({"n1": 4}, [_ext("7", "n2", 2)], {"n1": 4, "n4": 2}, (), ("7",), {"n4": 2}),  # move
    ({"n1": 4}, [_ext("7", "n2", 2)], {"n1": 4, "n2": 1}, (), ("7",), {"n2": 1}),  # 2 -> 1
    ({"n1": 4}, [_ext("7", "n2", 1), _ext("8", "n2", 2)], {"n1": 4, "n2": 2},
     ("7",), ("8",), {"n2": 1}),                                             # oldest first
    ({"n1": 2}, [], {"n1": 4}, (), (), {"n1": 2}),                           # more on n1 itself
    ({"n1": 4, "n2": 4}, [], {"n1": 4, "n2": 4}, (), (), {}),                # nothing to do
])
def test_plan_layout(primary, active, target, keep, release, add):
    plan = ex.plan_layout(primary, active, target)
    assert (plan.keep, plan.release, plan.add) == (keep, release, add)
    assert plan.changes == bool(release or add)


@pytest.mark.parametrize("target", [{"n2": 2}, {"n1": 2}, {"n1": 3, "n2": 4}])
def test_the_primary_gpus_cannot_be_given_back_in_place(target):
    with pytest.raises(ex.LayoutRefused, match="cannot be given back in place.*requeue"):
        ex.plan_layout({"n1": 4}, [], target)


# ------------------------------------------------------------------------------- tag
def test_the_tag_round_trips_and_nothing_else_parses():
    assert parse_extension_comment(extension_comment("123", "ab-c.1", 7)) == ("123", "ab-c.1", 7)
    for other in ("", "hello", "hpcsched-extension:12", "hpcsched-extension:x:u:g1",
                  "hpcsched-extension:1:u:g1 extra", "hpcsched-extension:1:../x:g1", None):
        assert parse_extension_comment(other) is None


# ------------------------------------------------------------------- extensions.json
def test_extensions_file_round_trips(tmp_path):
    path = tmp_path / "extensions.json"
    ext = Extensions("uid1", "42", (_ext("43", "n2", 2), _ext("44", "n3", 1, S)), 5.0)
    write_extensions(path, ext)
    back = read_extensions(path, "uid1")
    assert back == ext and back.extensions[0].state is ExtensionState.JOINED
    assert [e.job_id for e in back.active] == ["43", "44"]
    assert back.layout({"n1": 4}) == {"n1": 4, "n2": 2}   # joined ones only


@pytest.mark.parametrize("obj, message", [
    ({"extensions": "x"}, "must be a list of objects"),
    ({"extensions": [{"job_id": "1"}]}, "an extension entry"),
    ({"extensions": [{**json.loads(json.dumps(_ext("1", "n2", 2).__dict__)), "state": "zombie"}]},
     "is not one of"),
    ({"extensions": [{**json.loads(json.dumps(_ext("1", "n[2]", 2).__dict__)), "state": "joined"}]},
     "is not a node name"),
    ({"job_uid": "other"}, "written for job"),
])
def test_a_malformed_extensions_file_is_refused(tmp_path, obj, message):
    path = tmp_path / "extensions.json"
    base = {"schema": "hpcsched.extensions/1", "job_uid": "uid1", "primary_job_id": "42",
            "extensions": [], "time": 0.0}
    path.write_text(json.dumps({**base, **obj}))
    with pytest.raises(ctl.ProtocolError, match=message):
        read_extensions(path, "uid1")


# --------------------------------------------------------------------- control layout
def _control(**kw) -> ctl.Control:
    base = dict(job_uid="u", generation=2, action="reform", nodes=2, workers_per_node=4,
                global_batch_size=66, local_batch_size=11, accumulation_steps=1, lr_scale=1.0,
                issued_at=0.0, layout={"n1": 4, "n2": 2})
    return ctl.Control(**{**base, **kw})


def test_a_layout_makes_the_world_size():
    assert _control().validate().world_size == 6


@pytest.mark.parametrize("kw, message", [
    ({"layout": {}}, "'reform' needs a layout"),
    ({"nodes": 3}, "nodes 3 != the layout's 2"),
    ({"global_batch_size": 64}, "global_batch_size 64 != world size 6"),
    ({"layout": {"n1": 0, "n2": 6}}, "must be >= 1"),
    ({"layout": ["n1"]}, "must be an object"),
])
def test_a_bad_reform_control_is_refused(kw, message):
    with pytest.raises(ctl.ProtocolError, match=message):
        _control(**kw).validate()


# ---------------------------------------------------------------------------- forms
def test_a_form_round_trips_and_knows_its_layout():
    members = (rf.Member("p0", "n1"), rf.Member("p1", "n1"), rf.Member("e9.0", "n2", "9"))
    form = rf.Form(3, 5, members, ("e9.0",), 11, 2, 1.5)
    back = rf.Form.from_json(form.to_json())
    assert back == form
    assert (back.rank_of("e9.0"), back.rank_of("e9.1"), back.world_size) == (2, None, 3)
    assert back.layout() == {"n1": 2, "n2": 1} and back.primary_layout() == {"n1": 2}
    assert back.has_extensions and not rf.Form(0, 0, members[:2]).has_extensions


class _Store:
    """The TCPStore calls the survivors rule makes (set, check)."""

    def __init__(self, keys=()):
        self.keys = set(keys)

    def check(self, keys):
        return all(k in self.keys for k in keys)


OLD = rf.Form(4, 1, (rf.Member("p0", "n1"), rf.Member("p1", "n1"),
                     rf.Member("e9.0", "n2", "9"), rf.Member("e9.1", "n2", "9")))


def _alive(*ids):
    return _Store(f"hpcsched/alive/4/{i}" for i in ids)


def test_survivors_leave_out_a_gone_extension_at_once():
    alive = rf.survivors(_alive("p0", "p1"), OLD, gone=lambda m: m.allocation == "9",
                         timeout=60, poll=0.01)
    assert [m.id for m in alive] == ["p0", "p1"]


def test_survivors_wait_for_an_extension_that_still_runs_until_the_timeout():
    alive = rf.survivors(_alive("p0", "p1", "e9.0"), OLD, gone=lambda m: False, timeout=0.05,
                         poll=0.01)
    assert [m.id for m in alive] == ["p0", "p1", "e9.0"]


def test_a_primary_worker_is_never_counted_lost():
    with pytest.raises(RuntimeError, match="primary worker.*p1.*did not come back"):
        rf.survivors(_alive("p0"), OLD, gone=lambda m: True, timeout=0.01, limit=0.1, poll=0.01)


def test_a_grow_called_off_sends_its_waiting_newcomers_away():
    """Rank 0 gives a grow up: newcomers waiting for their invitation (in a real TCPStore, a
    blocking ``get``) learn it at once instead of waiting to be killed."""
    torch = pytest.importorskip("torch", reason="the job's store is torch's TCPStore")
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5))
    rf.call_off(store, 3)
    with pytest.raises(rf.GrowCalledOff, match="generation 3 was given up"):
        rf.invitation(store, 3)
    rf.invite(store, 4, 0)
    rf.Form(0, 4, (rf.Member("p0", "n1"),)).publish(store)
    assert rf.invitation(store, 4).generation == 4


# --------------------------------------------------------------- what Slurm is asked
def test_an_extension_is_the_users_job_on_the_primarys_terms(tmp_path, monkeypatch):
    from tests.test_launcher import _spec

    jd = JobDir.create(tmp_path)
    jd.write_spec(_spec(jd.uid))
    monkeypatch.setattr(ex.slurm, "time_left", lambda job_id: "1:02:03")
    env = {"SLURM_JOB_NAME": "train", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ACCOUNT": "ml",
           "SLURM_JOB_QOS": "normal"}
    e = ex.Extender(jd, jd.read_spec(), "42", env)
    args = e.sbatch_args("n2", 2, 3)
    assert f"--comment=hpcsched-extension:42:{jd.uid}:g3" in args
    for a in ("--job-name=train+ext", "--nodes=1", "--nodelist=n2", "--ntasks=2",
              "--gres=gpu:2", "--partition=gpu", "--account=ml", "--qos=normal",
              "--time=1:02:03", "--no-requeue", "--nice=1000000"):
        assert a in args
    script = e.script("n2", 2, 3).read_text()
    assert "exec srun --nodes=1 --ntasks=2 --ntasks-per-node=2" in script
    assert "-m hpcsched.worker" in script


def test_the_primarys_slurm_and_torch_variables_stay_behind():
    env = ex.extension_env({"SLURM_JOB_ID": "42", "SLURM_NODELIST": "n1", "RANK": "0",
                            "WORLD_SIZE": "4", "SLURM_CONF": "/etc/slurm.conf", "HOME": "/h",
                            "SBATCH_PARTITION": "x", "PMI_RANK": "0"},
                           {"HPCSCHED_JOIN_GENERATION": "3"})
    assert env == {"SLURM_CONF": "/etc/slurm.conf", "HOME": "/h",
                   "HPCSCHED_JOIN_GENERATION": "3"}


@pytest.mark.parametrize("raw, text", [
    ("hpcsched-extension:1:u:g2", "hpcsched-extension:1:u:g2"),          # 22.05: a string
    ({"job": "hpcsched-extension:1:u:g2", "administrator": None}, "hpcsched-extension:1:u:g2"),
    (None, ""), ({}, ""),                                                 # 23.02+: an object
])
def test_squeue_comments_of_every_version_read_the_same(raw, text):
    from hpcsched.slurm.parse import comment_text

    assert comment_text(raw) == text


def test_an_extension_entry_with_a_node_that_is_not_a_string_is_refused(tmp_path):
    path = tmp_path / "extensions.json"
    entry = {**_ext("1", "n2", 2).__dict__, "state": "joined", "node": 7}
    path.write_text(json.dumps({"schema": "hpcsched.extensions/1", "job_uid": "u",
                                "primary_job_id": "4", "extensions": [entry], "time": 0.0}))
    with pytest.raises(ctl.ProtocolError, match="'extensions\\[\\].node' must be str"):
        read_extensions(path, "u")


# ------------------------------------------------------------ the daemon's translation
@pytest.mark.parametrize("kind, to_nodes, placement, layout, want", [
    ("grow", 2, ("n1", "n2"), {"n1": 4}, {"n1": 4, "n2": 4}),            # one node added
    ("grow", 3, ("n2", "n1", "n3"), {"n1": 4}, {"n1": 4, "n2": 4, "n3": 4}),
    ("grow", 3, ("n1", "n2"), {"n1": 4}, None),                          # too few nodes named
    ("grow", 2, (), {"n1": 4}, None),                                    # Slurm would choose
    ("shrink", 2, (), {"n1": 4, "n2": 4, "n3": 4}, {"n1": 4, "n2": 4}),  # newest extension first
    ("shrink", 1, (), {"n1": 4, "n2": 4, "n3": 4}, {"n1": 4}),
    ("shrink", 1, (), {"n1": 4, "n5": 4, "n2": 4}, {"n1": 4, "n5": 4}),  # primary n1,n5 stays
    ("shrink", 1, (), {"n1": 4, "n5": 4}, None),                         # no extension: in place
    ("batch", 1, (), {"n1": 4, "n2": 4}, None),
])
def test_the_daemon_reaches_node_granular_plans_by_extension(kind, to_nodes, placement, layout,
                                                             want):
    from hpcsched.daemon.layouts import reform_layout
    from hpcsched.protocol.kinds import ChangeKind

    primary = {n: 4 for n in layout if n in ("n1", "n5")}
    assert reform_layout(ChangeKind(kind), to_nodes, placement, layout, primary, 4) == want


def test_the_layout_in_force_is_the_acknowledged_one_when_there_is_one():
    from hpcsched.daemon.layouts import layout_in_force
    from hpcsched.slurm.parse import JobInfo

    info = JobInfo("7", "j", "u", "RUNNING", "", "gpu", "n[1-2]", 2, 4, 0, "n1", 0)
    assert layout_in_force(info, None, 4) == ({"n1": 4, "n2": 4}, {"n1": 4, "n2": 4})
    a = ctl.Ack("u", 3, "applied", 10, 3, 10, 1, 1, 0, 0.0, layout={"n1": 4, "n2": 4, "n3": 2})
    assert layout_in_force(info, a, 4) == ({"n1": 4, "n2": 4, "n3": 2}, {"n1": 4, "n2": 4})


# ---------------------------------------------------------------- layouts, planned
def _plan(layout, primary, state="RUNNING"):
    from hpcsched.daemon.actuator import Current, plan_resize
    from tests.test_launcher import _spec

    spec = _spec("u", workers_per_node=2, min_nodes=1, max_nodes=4)
    return plan_resize(spec, Current(state, len(primary), 64, 3), layout=layout,
                       primary=primary)


@pytest.mark.parametrize("layout, primary, kind", [
    ({"n1": 2, "n2": 2}, {"n1": 2}, "reform"),            # grow by extension
    ({"n1": 2}, {"n1": 2}, "reform"),                     # release an extension
    ({"n1": 2, "n3": 4}, {"n1": 2}, "reform"),            # move one, any count
    ({"n4": 2}, {"n1": 2}, "grow"),                       # move the primary: requeue
    ({"n2": 2}, {"n1": 2}, "grow"),                       # off its node: requeue
])
def test_a_layout_is_reached_in_place_when_the_primary_keeps_its_gpus(layout, primary, kind):
    plan = _plan(layout, primary)
    assert (plan.kind, plan.layout, plan.generation) == (kind, layout, 4)
    assert plan.batch.world_size == sum(layout.values())


def test_a_requeue_onto_uneven_gpus_per_node_is_refused():
    from hpcsched.daemon.actuator import ResizeRefused

    with pytest.raises(ResizeRefused, match="same GPUs on every node: n3:2,n4:1 does not"):
        _plan({"n3": 2, "n4": 1}, {"n1": 2})
