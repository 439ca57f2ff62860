"""Workload loaders of the simulator (hpcsched.sim.workload): shipped data, formats, errors."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import pytest

from hpcsched.daemon.store import Store
from hpcsched.sim import WorkloadJob
from hpcsched.sim import workload as wl
from hpcsched.sim.tuned import tuned_batch_size
from hpcsched.sim.workload import WorkloadError, load_workload

LOAD_JOBS = {"0.5": 80, "1.0": 160, "1.5": 240, "2.0": 320}


def _sorted(jobs: list[WorkloadJob]) -> bool:
    return all(a.submit_time <= b.submit_time for a, b in itertools.pairwise(jobs))


# -- shipped data --------------------------------------------------------------------------------


@pytest.mark.parametrize("load", wl.POLLUX_LOADS)
@pytest.mark.parametrize("number", range(1, 9))
def test_every_shipped_pollux_workload_loads(number, load):
    name, jobs = load_workload(f"pollux:{number}@{load}")
    assert name == f"pollux:{number}@{load}"
    assert len(jobs) == LOAD_JOBS[load]
    assert _sorted(jobs)
    assert len({j.name for j in jobs}) == len(jobs)
    for j in jobs:
        assert j.application in wl.POLLUX_APP_CLASS
        assert j.app_class == wl.POLLUX_APP_CLASS[j.application]
        assert j.gpus >= 1 and j.batch_size >= 1
        assert j.iterations is None and j.iteration_time is None
    assert jobs[-1].submit_time < 9 * 3600          # about 8 h of arrivals


def test_pollux_default_load_is_one_and_fields_map_exactly():
    name, jobs = load_workload("pollux:1")
    assert name == "pollux:1@1.0"
    assert load_workload("pollux:1@1")[1] == jobs
    # first row of workload-1.csv: cifar10-0,107,cifar10,6,2048
    assert jobs[0] == WorkloadJob(name="cifar10-0", submit_time=107.0, application="cifar10",
                                  gpus=6, batch_size=2048, app_class="A")
    second = jobs[1]               # deepspeech2-1,110,deepspeech2,6,320
    assert (second.name, second.submit_time, second.application, second.gpus,
            second.batch_size, second.app_class) == ("deepspeech2-1", 110.0, "deepspeech2", 6,
                                                     320, "B")


def test_pollux_file_path_gives_the_same_jobs():
    path = wl.pollux_workload_path(3, "1.5")
    name, jobs = load_workload(str(path))
    assert name == "workload-3.csv"
    assert jobs == load_workload("pollux:3@1.5")[1]


def test_app_classes_follow_pal():
    assert wl.POLLUX_APP_CLASS == {"imagenet": "A", "cifar10": "A", "yolov3": "A",
                                   "bert": "B", "deepspeech2": "B", "ncf": "D"}


@pytest.mark.parametrize("number", range(1, 9))
def test_every_shipped_pal_trace_loads_with_the_artifacts_classes(number):
    name, jobs = load_workload(f"pal:{number}")
    assert name == f"pal:{number}"
    assert len(jobs) == 160 and _sorted(jobs)
    classes = {"resnet50": "A", "vgg19": "C", "PointNet": "D", "DCGAN": "B", "BERT": "B",
               "GPT2": "B"}
    for j in jobs:
        model = j.name.rsplit("-", 1)[0]
        assert j.app_class == classes[model]
        assert j.iteration_time == wl.PAL_MODELS[model].iteration_time
        assert j.application == wl.PAL_MODELS[model].application
        assert j.iterations > 0 and j.gpus >= 1 and j.batch_size >= 1


def test_pal_first_row_maps_exactly():
    jobs = load_workload("pal:1")[1]
    # first rows of workload-1.csv: 0,1,98,1481.0,vgg19 and 1,12,115,4037.0,DCGAN
    assert jobs[0] == WorkloadJob(name="vgg19-0", submit_time=98.0, application="imagenet",
                                  gpus=1, batch_size=200, app_class="C", iterations=1481.0,
                                  iteration_time=0.300610341)
    dcgan = jobs[1]
    assert (dcgan.name, dcgan.gpus, dcgan.iterations, dcgan.app_class,
            dcgan.batch_size) == ("DCGAN-1", 12, 4037.0, "B", min(128 * 12, 4096))


def test_pal_batch_size_column_is_used(tmp_path):
    f = tmp_path / "sia.csv"
    f.write_text("job_id,num_gpus,submit_time,duration,model,batch_size\n"
                 "0,6,53,2868,PointNet,2048\n1,2,10,100,resnet50,\n")
    jobs = load_workload(str(f))[1]
    assert [j.name for j in jobs] == ["resnet50-1", "PointNet-0"]        # sorted by submit time
    assert jobs[1].batch_size == 2048 and jobs[1].app_class == "D"
    assert jobs[0].batch_size == 400 and jobs[0].app_class == "A"       # empty: default


def test_published_results_ship():
    r = wl.pollux_results("pollux", "1.0")
    assert r["mean"] == pytest.approx(2751.13, abs=0.01)
    assert sorted(r["avgs"]) == [f"workload-{i}" for i in range(1, 9)]
    assert wl.pollux_results("tiresias", 1)["mean"] == pytest.approx(4038, abs=1)
    assert wl.pollux_results("optimus", 1.0)["mean"] == pytest.approx(5682, abs=1)
    for policy in wl.POLLUX_POLICIES:
        for load in wl.POLLUX_LOADS:
            res = wl.pollux_results(policy, load)
            assert set(res) >= {"avgs", "mean"}
    with pytest.raises(WorkloadError):
        wl.pollux_results("pollux", 3.0)


# -- Philly samples ------------------------------------------------------------------------------


def test_philly_sample_is_deterministic_per_seed_and_spans_8h():
    name, a = load_workload("philly:160", seed=7)
    assert name == "philly:160-seed7"
    assert load_workload("philly:160", seed=7)[1] == a
    b = load_workload("philly:160", seed=8)[1]
    assert a != b
    assert len(a) == 160 and _sorted(a)
    assert a[0].submit_time == 0.0
    assert a[-1].submit_time == pytest.approx(8 * 3600)
    for j in a:
        assert 1 <= j.gpus <= 64
        assert j.batch_size == tuned_batch_size(j.application, j.gpus)   # Pollux's TunedJobs
        assert j.app_class == wl.POLLUX_APP_CLASS[j.application]
        assert j.iterations is None
    assert len({j.name for j in a}) == 160


def test_philly_sample_mixes_applications_like_pollux():
    jobs = load_workload("philly:2000", seed=0)[1]
    counts = Counter(j.application for j in jobs)
    assert set(counts) == set(wl.POLLUX_APP_CLASS)
    # most Philly jobs are under a GPU-hour: cifar10 and ncf dominate, imagenet is rare
    assert counts["cifar10"] + counts["ncf"] > len(jobs) / 2
    assert counts["imagenet"] < counts["yolov3"] < counts["cifar10"]


def test_batch_size_table_matches_pollux_validation_files():
    assert wl.APP_BATCH_SIZES == {"bert": (12, 384), "cifar10": (128, 4096),
                                  "deepspeech2": (20, 640), "imagenet": (200, 12800),
                                  "ncf": (256, 32768), "yolov3": (8, 512)}
    assert wl.default_batch_size("cifar10", 64) == 4096
    assert wl.default_batch_size("imagenet", 2) == 400


# -- the store's history -------------------------------------------------------------------------


def _job(job_id: str, **kw) -> dict:
    fields = {"job_id": job_id, "job_uid": f"uid{job_id}", "workers_per_node": 4,
              "min_nodes": 1, "max_nodes": 2, "min_batch_size": 64, "max_batch_size": 1024,
              "base_batch_size": 256}
    fields.update(kw)
    return fields


def test_store_history_round_trips(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    store = Store(url)
    store.upgrade()
    store.upsert_job(**_job("101", submit_time=1000.0, last_seen=1000.0, app_class="imagenet",
                            spec_json=json.dumps({"nodes": 2})))
    store.upsert_job(**_job("102", submit_time=1600.5, last_seen=1700.0, app_class="train",
                            workers_per_node=2, base_batch_size=128))
    store.upsert_job(**_job("103", submit_time=None, first_seen=1300.0, last_seen=1300.0,
                            app_class="BERT", max_nodes=3, spec_json=json.dumps({"nodes": 1})))
    store.close()
    name, jobs = load_workload(f"store:{url}")
    assert name == f"store:{url}"
    assert jobs == [
        WorkloadJob(name="imagenet-101", submit_time=0.0, application="imagenet", gpus=8,
                    batch_size=256, app_class="A"),
        WorkloadJob(name="bert-103", submit_time=300.0, application="bert", gpus=4,
                    batch_size=256, app_class="B"),
        WorkloadJob(name="cifar10-102", submit_time=600.5, application="cifar10", gpus=4,
                    batch_size=128, app_class="A"),       # no spec: max_nodes (2) x 2
    ]


def test_store_default_url_comes_from_the_environment(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    store = Store(url)
    store.upgrade()
    store.upsert_job(**_job("7", submit_time=5.0, last_seen=5.0, app_class="ncf"))
    store.close()
    monkeypatch.delenv("HPCSCHED_CONFIG", raising=False)
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", url)
    name, jobs = load_workload("store")
    assert name == "store:" + url
    assert [(j.name, j.gpus, j.app_class) for j in jobs] == [("ncf-7", 8, "D")]


def test_empty_store_is_an_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).upgrade()
    with pytest.raises(WorkloadError, match="no jobs"):
        load_workload(f"store:{url}")


def test_store_errors_are_workload_errors(tmp_path):
    with pytest.raises(WorkloadError, match="no such database file"):
        load_workload(f"store:sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "blank.db").write_bytes(b"")
    with pytest.raises(WorkloadError, match="db upgrade"):
        load_workload(f"store:sqlite:///{tmp_path / 'blank.db'}")
    with pytest.raises(WorkloadError, match="not a database URL"):
        load_workload("store:::nonsense")


# -- malformed input -----------------------------------------------------------------------------

POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"
PAL_HEADER = "job_id,num_gpus,submit_time,duration,model\n"


@pytest.mark.parametrize("text, line, message", [
    (POLLUX_HEADER + "a,1,cifar10,1,128\nb,2,mnist,1,128\n", 3, "unknown application 'mnist'"),
    (POLLUX_HEADER + "a,1,cifar10,0,128\n", 2, "num_replicas must be a positive integer"),
    (POLLUX_HEADER + "a,1,cifar10,2,-5\n", 2, "batch_size must be a positive integer"),
    (POLLUX_HEADER + "a,1,cifar10,1.5,128\n", 2, "num_replicas must be a positive integer"),
    (POLLUX_HEADER + "a,soon,cifar10,1,128\n", 2, "time must be a number"),
    (POLLUX_HEADER + "a,-1,cifar10,1,128\n", 2, "must not be negative"),
    (POLLUX_HEADER + "a,nan,cifar10,1,128\n", 2, "must be finite"),
    (POLLUX_HEADER + "a,1,cifar10,1\n", 2, "expected 5 fields"),
    (POLLUX_HEADER + "a,1,cifar10,1,128\n\na,2,ncf,1,256\n", 4, "appears twice"),
    (POLLUX_HEADER + ",1,cifar10,1,128\n", 2, "empty job name"),
    (PAL_HEADER + "0,1,98,1481.0,vgg19\n1,2,99,10,alexnet\n", 3, "unknown model 'alexnet'"),
    (PAL_HEADER + "0,0,98,1481.0,vgg19\n", 2, "num_gpus must be a positive integer"),
    (PAL_HEADER + "0,1,98,0,vgg19\n", 2, "duration (iterations) must be positive"),
    (PAL_HEADER + "0,1,98,10,vgg19\n0,1,99,10,vgg19\n", 3, "job_id '0' appears twice"),
    ("job_id,num_gpus,submit_time,duration,model,batch_size\n0,1,98,10,vgg19,0\n", 2,
     "batch_size must be a positive integer"),
    ("foo,bar\n1,2\n", 1, "unknown header 'foo,bar'"),
    ("name,name,time,application,num_replicas,batch_size\n", 1, "repeated column"),
])
def test_malformed_rows_name_file_and_line(tmp_path, text, line, message):
    assert_refused(tmp_path, text, line, message)


def assert_refused(tmp_path, text: str, line: int, message: str) -> None:
    """A workload file holding ``text`` is refused with one line naming the file, ``line``
    and ``message``."""
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(WorkloadError) as info:
        load_workload(str(f))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{f}:{line}: "), msg
    assert message in msg, msg


@pytest.mark.parametrize("spec, message", [
    ("pollux:9", "no shipped workload 9"),
    ("pollux:0", "no shipped workload 0"),
    ("pollux:x", "expected pollux:N"),
    ("pollux:1@3", "load '3' is not shipped"),
    ("pollux:1@fast", "not shipped"),
    ("pal:12", "no shipped workload 12"),
    ("philly:0", "positive integer"),
    ("philly:lots", "positive integer"),
    ("philly:10000000", "only"),
    ("sia:3", "unknown workload name 'sia:'"),
    ("", "empty workload name"),
])
def test_bad_short_names(spec, message):
    with pytest.raises(WorkloadError, match=re.escape(message)):
        load_workload(spec)


def test_file_errors(tmp_path):
    with pytest.raises(WorkloadError, match=r"missing\.csv: no such workload file"):
        load_workload(str(tmp_path / "missing.csv"))
    with pytest.raises(WorkloadError, match="is a directory"):
        load_workload(str(tmp_path))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(WorkloadError, match="empty file"):
        load_workload(str(empty))
    header_only = tmp_path / "header.csv"
    header_only.write_text(POLLUX_HEADER)
    with pytest.raises(WorkloadError, match="no jobs"):
        load_workload(str(header_only))
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(str(binary))


def test_bad_seed_is_a_workload_error():
    with pytest.raises(WorkloadError, match="bad seed"):
        load_workload("philly:3", seed=-1)
