"""The site's limits, enforced by the daemon itself (issue 33): a job is planned within the
smallest of its spec's largest size, the job_submit plugin's tag and the site's max_gpus for its
partition, read from the plugin's own settings file."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from hpcsched.daemon.site_limits import (
    SiteLimits,
    cap,
    default_path,
    job_limits,
    read_site_limits,
    tagged_max_gpus,
)
from hpcsched.protocol.limits import JobLimits

LIMITS = JobLimits(4, 1, 8, 32, 4096, None, 128)    # 4 GPUs per node, 1-8 nodes: up to 32 GPUs


def test_the_plugins_settings_file_is_read_as_the_plugin_reads_it(tmp_path, caplog):
    f = tmp_path / "job_submit_hpcsched.conf"
    f.write_text("# site limits\nhold_seconds = 0\nmax_gpus = 64   -- every partition\n"
                 "max_time = 1440\npartition.gpu.max_gpus = 16\npartition.big-a100.max_gpus = 128\n"
                 "max_gpus: lots\nextension_qos = hpcsched-lend   # lent GPUs\n"
                 "submit_stamp = /run/hpcsched/submitted\n")
    with caplog.at_level(logging.WARNING):
        site = read_site_limits(f)
    assert site == SiteLimits(64, {"gpu": 16, "big-a100": 128}, "hpcsched-lend",
                              "/run/hpcsched/submitted")
    assert (site.max_gpus_in("gpu"), site.max_gpus_in("cpu")) == (16, 64)
    assert "line 7 ignored" in caplog.text and "line 9" not in caplog.text
    assert read_site_limits(tmp_path / "missing.conf") == SiteLimits()   # no file: no limit


def test_the_default_file_is_beside_slurm_conf(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-lab/slurm.conf")
    assert default_path() == Path("/etc/slurm-lab/job_submit_hpcsched.conf")


def test_the_plugins_tag():
    assert tagged_max_gpus("hpcsched:elastic job=ab12 max_gpus=16") == 16
    assert tagged_max_gpus("hpcsched:extension of 41") is None
    assert tagged_max_gpus("") is None


def test_cap_in_whole_nodes_never_below_the_smallest_size():
    assert cap(LIMITS, None, None) is LIMITS
    assert cap(LIMITS, 64) is LIMITS                          # above the spec's: nothing to do
    assert cap(LIMITS, 16).max_nodes == 4
    assert cap(LIMITS, 18, 40).max_nodes == 4                 # the smallest bound, whole nodes
    assert cap(replace(LIMITS, min_nodes=2), 4).max_nodes == 2    # its smallest size stays


def test_a_spec_that_claims_more_than_slurm_accepted_is_planned_within_the_tag(caplog):
    with caplog.at_level(logging.WARNING):
        got = job_limits("77", LIMITS, "hpcsched:elastic job=ab max_gpus=8", "gpu",
                         SiteLimits(None, {"gpu": 16}))
        again = job_limits("77", LIMITS, "hpcsched:elastic job=ab max_gpus=8", "gpu", SiteLimits())
    assert got.max_gpus == 8 and again.max_gpus == 8
    assert caplog.text.count("job 77: its spec.json says up to 32 GPUs") == 1   # once
    assert job_limits("78", LIMITS, "", "gpu", SiteLimits(None, {"gpu": 16})).max_gpus == 16
