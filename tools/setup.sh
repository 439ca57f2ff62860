#!/usr/bin/env bash
# Set up hpcsched for development on Debian 12 (run as root): Debian packages for Slurm and a
# Python virtual environment in .venv with hpcsched installed editable, plus torch (CPU) and the
# test tools. Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# --python-only: the virtual environment alone (no Slurm packages, no root), for tests that do not
# use the dev cluster (tools/test.sh --quick).
need_apt=()
if [ "${1:-}" != "--python-only" ]; then
    command -v slurmctld >/dev/null || need_apt+=(slurm-wlm)
    command -v munged >/dev/null || need_apt+=(munge)
    command -v slurmdbd >/dev/null || need_apt+=(slurmdbd)
    command -v mariadbd >/dev/null || need_apt+=(mariadb-server)
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# torch first and pinned: 2.13.0 is a CPU wheel available locally; an unpinned torch pulls GBs of CUDA.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[daemon,train,dev]'
echo "setup: ready (.venv/bin/hpcsched, .venv/bin/hpcsub)" >&2
