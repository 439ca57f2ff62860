#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the whole test suite, including the tests against the real
# local Slurm dev cluster, which tests/conftest.py starts (needs root) and stops again.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec .venv/bin/python -m pytest -q "$@"
