#!/usr/bin/env bash
# Set up (tools/setup.sh), lint (ruff: rules in pyproject.toml), type-check (mypy: files in
# pyproject.toml) and run the whole test suite, including the tests against real local Slurm
# dev clusters, which tests/conftest.py starts (needs root) and stops again. Prints the wall time
# at the end. Extra arguments go to pytest.
#
#   tools/test.sh           everything (about 15 min on 2 cores)
#   tools/test.sh --quick   no dev cluster and no root: every test not marked slurm (about 3 min)
#
# Three pytest-xdist workers ($HPCSCHED_TEST_WORKERS, at most 7), each with a dev cluster of its
# own (state directory and ports: tests/conftest.py), so the cluster tests' waits overlap;
# --dist worksteal evens out their very unequal lengths (5 s to 5 min). On 2 cores, four made
# resize tests fail now and then (their jobs ended before a slowed grow applied); six, often.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
quick=()
if [ "${1:-}" = "--quick" ]; then
    quick=(-m "not slurm")
    shift
    tools/setup.sh --python-only
else
    tools/setup.sh
fi
.venv/bin/ruff check .
.venv/bin/mypy
rc=0
.venv/bin/python -m pytest -q -n "${HPCSCHED_TEST_WORKERS:-3}" --dist worksteal "${quick[@]}" "$@" || rc=$?
echo "tools/test.sh: $((SECONDS - start)) s wall${quick:+ (--quick)}, pytest exit $rc" >&2
exit $rc
