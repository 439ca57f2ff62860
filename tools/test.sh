#!/usr/bin/env bash
# Set up (tools/setup.sh), lint (ruff: rules in pyproject.toml) and run the whole test suite,
# including the tests against the real local Slurm dev cluster, which tests/conftest.py starts
# (needs root) and stops again. Extra arguments go to pytest (e.g. -m "not slurm").
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
