#!/usr/bin/env bash
# Set up (tools/setup.sh), lint (ruff: rules in pyproject.toml), type-check (mypy: files in
# pyproject.toml) and run the whole test suite, including the tests against real local Slurm
# dev clusters, which tests/conftest.py starts (needs root) and stops again. Prints the wall time
# at the end. Extra arguments go to pytest.
#
#   tools/test.sh           everything (11-12 min on 2 cores from a fresh clone, 10.5 min after)
#   tools/test.sh --quick   no dev cluster and no root: every test not marked slurm (about 3 min)
#
# Four pytest-xdist workers (three with --quick; $HPCSCHED_TEST_WORKERS, at most 7), each with a
# dev cluster of its own (state directory and ports: tests/conftest.py), so the cluster tests'
# waits overlap; --dist worksteal evens out their very unequal lengths (5 s to 3 min). Four
# became safe on 2 cores once the resize tests' jobs were paced (tests/conftest.py: paced,
# unpace_when: a job cannot end before a slowed grow applies); the whole suite took 871-924 s
# with three, 762-787 s with four. It is CPU-bound there (0% idle): two thirds of its CPU is the jobs' training
# workers (process accounting, acct(5): 60% in the jobs' python3, 32% in pytest's python), most of
# that importing torch (1.0 s) and torch._dynamo (1.1 s), which every torch.optim step imports; the
# emulated application no longer uses torch.optim (1.84 s of CPU per worker, was 3.39): 723-751 s.
# The system share (20-40%) is gloo's: perf record -a over a dev-cluster test put 32% of all CPU in
# the workers' gloo_tcp_loop threads and 9% in pt_gloo_runloop, mostly in the kernel (epoll_wait,
# wake-ups, context switches) -- the per-step all-reduces of the test jobs' many short steps; an
# idle gloo group costs nothing (0.04 s of CPU in 10 s). The paced test jobs once trained their
# margin epochs unpadded after the test had seen what it checks, about 135 CPU-s; they now end with
# the epoch in progress (tests/paced_digits.py): 631-641 s here, 683-731 s from a fresh clone.
# What is left of the jobs' CPU is mostly their workers' start (2.3 s each, torch and dynamo).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
quick=()
workers=4
if [ "${1:-}" = "--quick" ]; then
    quick=(-m "not slurm")
    workers=3   # nothing waits on a cluster: a fourth worker only contends (177 s against 187 s)
    shift
    tools/setup.sh --python-only
else
    tools/setup.sh
fi
.venv/bin/ruff check .
.venv/bin/mypy
rc=0
.venv/bin/python -m pytest -q -n "${HPCSCHED_TEST_WORKERS:-$workers}" --dist worksteal "${quick[@]}" "$@" || rc=$?
echo "tools/test.sh: $((SECONDS - start)) s wall${quick:+ (--quick)}, pytest exit $rc" >&2
exit $rc
