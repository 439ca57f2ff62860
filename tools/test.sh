#!/usr/bin/env bash
# Set up (tools/setup.sh), lint (ruff: rules in pyproject.toml) and run the whole test suite,
# including the tests against the real local Slurm dev cluster, which tests/conftest.py starts
# (needs root) and stops again. Extra arguments go to pytest (e.g. -m "not slurm").
# Two pytest-xdist workers: the tests on the dev cluster share it and run one after another in
# one worker (tests/conftest.py puts them in one xdist group); the rest, mostly CPU, run beside
# them in the other. About 1,300 of the suite's 1,750 s are the cluster tests, mostly waiting.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup "$@"
