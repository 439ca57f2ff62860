"""benchmarks/daemon_scale.py's own parts: what its --tracemalloc diagnosis reports, how it
puts the compute nodes below the kernel's threads (--compute-nice) and slurmctld's state on a
file system of its own (--ctld-state-fs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import tracemalloc

import pytest

from tests.bench_scripts import load


def _hold(n: int) -> list[bytes]:
    return [bytes(1024) for _ in range(n)]


def test_the_places_that_grew_most_are_reported_first_with_their_callers():
    bench = load("daemon_scale")
    tracemalloc.start(5)
    try:
        big = _hold(2000)      # about 2 MiB kept
        small = _hold(100)     # and 100 KiB, from another line
        growth = bench.traced_growth(tracemalloc.take_snapshot(), 2)
    finally:
        tracemalloc.stop()
    assert len(growth) == 2 and growth[0]["kib"] >= 1900 and growth[0]["blocks"] >= 2000
    here = "tests/test_daemon_scale_script.py:"
    assert all(w.startswith(here) for w in growth[0]["where"][-3:])   # _hold, and this test
    assert growth[1]["where"][-1] == growth[0]["where"][-1]        # the same allocation line,
    assert growth[1]["where"] != growth[0]["where"]                # called from another line
    assert 90 <= growth[1]["kib"] < 200
    assert len(big) + len(small) == 2100


@contextlib.contextmanager
def _threaded_child(threads: int):
    """A child process with ``threads`` threads in all, each asleep; killed on exit."""
    child = subprocess.Popen([sys.executable, "-c",
                              "import threading, time\n"
                              f"for _ in range({threads - 1}):\n"
                              "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"
        yield child
    finally:
        child.kill()
        child.wait()


def test_compute_priority_renices_every_thread_of_the_compute_nodes_daemons(monkeypatch):
    """Every thread of each slurmd is set, so a job forked from any of them inherits the nice
    value (here a child with three threads stands in for a slurmd)."""
    bench = load("daemon_scale")
    with _threaded_child(3) as child:
        monkeypatch.setattr(bench, "find_procs", lambda comm: [child.pid] if comm == "slurmd" else [])
        assert bench.compute_priority(7) == 3
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) == 3 and all(os.getpriority(os.PRIO_PROCESS, int(t)) == 7 for t in tasks)


def test_blocked_stacks_names_the_kernel_stack_a_thread_waits_at():
    """A thread blocked in a kernel wait shows up with its stack; frames that say only that it
    sleeps are left out of the key, and a take empties what was seen."""
    probes = load("_host_probes")
    key = probes._stack_key("[<0>] __schedule+0x1/0x2\n[<0>] schedule+0x1/0x2\n"
                            "[<0>] jbd2_log_wait_commit+0x9f/0x120\n[<0>] ext4_sync_file+0x1/0x2\n"
                            "[<0>] do_syscall_64+0x71/0x290\n")
    assert key == "jbd2_log_wait_commit < ext4_sync_file"
    seen = probes.BlockedStacks(interval=0.01)
    seen._seen[("other", key)] += 30
    assert seen.take() == [{"thread": "other", "stack": key, "s": 0.3}]
    assert seen.take() == []


def test_blocked_time_over_the_long_rounds_is_summed_per_stack():
    bench = load("daemon_scale")
    rounds = [{"blocked": [{"thread": "round", "stack": "a", "s": 1.0}, {"thread": "other", "stack": "b", "s": 0.5}]},
              {"blocked": [{"thread": "round", "stack": "a", "s": 2.0}]}, {}]
    assert bench.blocked_in(rounds) == [{"thread": "round", "stack": "a", "s": 3.0},
                                        {"thread": "other", "stack": "b", "s": 0.5}]


def test_kernel_threads_are_named_by_kind_and_listed_from_kthreadd():
    probes = load("_host_probes")
    assert probes.thread_kind("kworker/u8:2-loop0\n") == "kernel kworker/uN:N-loopN"
    assert probes.thread_kind("jbd2/loop0-8") == "kernel jbdN/loopN-N"
    pids = probes.kernel_threads()
    assert pids and os.getpid() not in pids      # a Linux host always has some; this is none
    assert all(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == "2"
               for p in pids[:20] if os.path.exists(f"/proc/{p}"))


def test_blocked_stacks_samples_every_thread_of_a_named_process(monkeypatch):
    """The threads of a process given by name (slurmctld in the benchmark) are sampled under
    that name; a thread not in uninterruptible sleep is not counted."""
    probes = load("_host_probes")
    with _threaded_child(2) as child:
        tids = {int(t) for t in os.listdir(f"/proc/{child.pid}/task")}
        assert len(tids) == 2 and sorted(probes.threads_of([child.pid, None])) == sorted(tids)
        real = probes.proc_state
        # the child's threads sleep interruptibly (S); one of them is taken for blocked (D)
        blocked_tid = max(tids)
        monkeypatch.setattr(probes, "proc_state",
                            lambda tid: ("python3", "D") if tid == blocked_tid else real(tid))
        seen = probes.BlockedStacks(interval=0.01, processes={"slurmctld": child.pid}).start()
        time.sleep(0.3)
        seen.stop()
        got = seen.take()
        assert [g["thread"] for g in got] == ["slurmctld"] and got[0]["s"] >= 0.05


def test_controller_state_mounts_the_state_directory_in_memory_and_stops_the_cluster_first(
        monkeypatch, tmp_path):
    """--ctld-state-fs: slurmctld's state directory is a mount of its own (ext4 on a loop device
    over an image in /dev/shm) for the block; the cluster is stopped before it is unmounted,
    and the image and loop device are gone after (a real mount; needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    bench = load("daemon_scale")
    monkeypatch.setattr(bench, "STATE_DIR", tmp_path)
    state = bench.Layout(tmp_path).state
    order = []
    monkeypatch.setattr(bench, "stop_cluster", lambda user: order.append(("stop", os.path.ismount(state))))
    image = "/dev/shm/hpcsched-bench-state.ext4"
    with bench.controller_state(1, keep=False, user="nobody"):
        assert os.path.ismount(state) and os.path.exists(image)
        backing = subprocess.run(["losetup", "--associated", image], capture_output=True, text=True).stdout
        assert backing.strip()
        (state / "job_state").write_bytes(b"x" * 4096)
        os.sync()
    assert order == [("stop", True)]            # the cluster stopped while its state was still there
    assert not os.path.ismount(state) and not os.path.exists(image)
    assert not subprocess.run(["losetup", "--associated", image], capture_output=True, text=True).stdout.strip()
    with bench.controller_state(0, keep=False, user="nobody"):
        assert not os.path.ismount(state)
    assert order == [("stop", True)]            # with 0 nothing is mounted and nothing stopped


def test_the_changes_are_summed_by_kind_and_phase_and_failures_by_reason(tmp_path):
    """A real store's journal: two grows Slurm never started (their numbers differ) are one
    reason; a running shrink is counted by its phase."""
    from hpcsched.daemon.store import Store
    bench = load("daemon_scale")
    store = Store(f"sqlite:///{tmp_path}/d.db")
    store.upgrade()
    fields = dict(generation=1, from_nodes=1, to_nodes=2, from_batch_size=32, to_batch_size=64)
    for job in ("7", "8", "9"):
        store.upsert_job(job_id=job, job_uid=f"u{job}", workers_per_node=4, min_nodes=1,
                         max_nodes=4, min_batch_size=32, max_batch_size=256, base_batch_size=32)
    for job, wait in (("7", 174), ("8", 171)):
        a = store.plan_action(job_id=job, kind="grow", **fields)
        store.set_action_phase(a, "failed", f"extension job 9{job} did not start within {wait} s "
                                            "(Slurm: PENDING, reason Priority)")
    store.set_action_phase(store.plan_action(job_id="9", kind="shrink", **fields), "running")
    got = bench.journal_outcomes(store)
    store.close()
    assert got == {"actions": 3, "by_kind_phase": {"grow failed": 2, "shrink running": 1},
                   "failed_reasons": {"extension job N did not start within N s (Slurm: "
                                      "PENDING, reason Priority)": 2}}
