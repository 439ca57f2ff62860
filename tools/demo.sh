#!/usr/bin/env bash
# The main job on the local default: the daemon at work. A 4-node x 4-GPU dev cluster, the
# daemon with its default policy, and a short workload (jobscripts/examples/demo-workload.csv:
# four jobs of Pollux's applications, emulated, arriving over a minute) replayed through Slurm
# with hpcsub. While it runs, `hpcsched status` shows the daemon's decisions and their reasons;
# at the end, the real run against the simulator's prediction of it. About 4-5 minutes after
# setup on a 2-core machine. Outputs: demo-output/.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
eval "$(hpcsched devcluster up)"                 # exports SLURM_CONF
rm -rf demo-output && mkdir -p demo-output && cd demo-output
export HPCSCHED_CONTROL_DIR="$PWD/jobs"           # the demo's job directories: status shows its jobs only

# The daemon: default policy, 5 s rounds (60 s by default; the demo's jobs last minutes), its
# own store and lock here (a production daemon uses /etc/hpcsched/hpcsched.toml).
cat > hpcsched.toml <<EOF
[daemon]
round_interval = 5.0
lock_file = "$PWD/daemon.lock"
database_url = "sqlite:///$PWD/hpcsched.db"
EOF
export HPCSCHED_CONFIG="$PWD/hpcsched.toml"
hpcsched daemon >daemon.log 2>&1 &
daemon=$!
watcher=""
cleanup() {
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null || true
    kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
}
trap cleanup EXIT
echo "demo: daemon started (pid $daemon, log demo-output/daemon.log); replaying the workload"

# What the daemon decides, every 40 s while the workload runs.
( while sleep 40; do echo; echo "----- hpcsched status, $(date +%T)"; hpcsched status || true; done ) &
watcher=$!

hpcsched replay ../jobscripts/examples/demo-workload.csv --scale 0.06 --out replay --poll 2
kill "$watcher" 2>/dev/null || true
watcher=""
echo
echo "----- the daemon's decisions (hpcsched status, then each job's decisions with their reasons):"
hpcsched status --all
for job in $(tail -n +2 replay/jobs.csv | cut -d, -f3); do
    hpcsched status "$job" | sed -n '/decisions (newest first)/,/measured throughput/p' | sed '$d'
done
echo
echo "----- real against simulated (the same scaled workload, this cluster's measured costs):"
hpcsched replay --from replay --compare
