#!/usr/bin/env bash
# The main job on the local default: a 4-node x 4-GPU dev cluster, an elastic training job
# submitted with hpcsub on 2 nodes, resized three ways (batch size, shrink, grow), and status.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
eval "$(hpcsched devcluster up)"                 # exports SLURM_CONF
export HPCSCHED_CONTROL_DIR="${HPCSCHED_CONTROL_DIR:-$HOME/.hpcsched/jobs}"
mkdir -p demo-output && cd demo-output

job=$(hpcsub --parsable -N 2 --gres=gpu:2 --hpcsched-max-nodes 3 \
        --hpcsched-batch-size 64 --hpcsched-max-batch-size 256 \
        ../jobscripts/examples/digits_mlp.py --epochs 60 --min-step-time 0.02)
echo "submitted job $job (output: demo-output/slurm-$job.out)"
for _ in $(seq 240); do                           # up to 2 minutes for the first training step
    [ -s "$HPCSCHED_CONTROL_DIR/$(id -un)/by-id/$job/ack.json" ] && break
    sleep 0.5
done
if [ ! -s "$HPCSCHED_CONTROL_DIR/$(id -un)/by-id/$job/ack.json" ]; then
    echo "demo: job $job has not started training; see demo-output/slurm-$job.out" >&2
    exit 1
fi

set -x
hpcsched resize "$job" --batch-size 128 --reason "demo: larger batch"
hpcsched resize "$job" --nodes 1 --reason "demo: shrink in place"
hpcsched resize "$job" --nodes 3 --reason "demo: grow by requeue"
hpcsched status
set +x
while squeue -h -j "$job" -o %T 2>/dev/null | grep -qE 'RUNNING|PENDING|COMPLETING'; do sleep 2; done
hpcsched status "$job"
tail -n 3 "slurm-$job.out"
