#!/usr/bin/env bash
# Scheduler and GPU workers on this one host, in the background; stop with: kill $(cat daskmeans-cluster.pids)
set -euo pipefail
export DASKMEANS_SHARED=${DASKMEANS_SHARED:-$PWD}
here=$(dirname "$0")
bash "$here/scheduler.sh" > scheduler.log 2>&1 & echo $! > daskmeans-cluster.pids
for _ in $(seq 50); do [ -f "$DASKMEANS_SHARED/scheduler.json" ] && break; sleep 0.2; done
bash "$here/gpu-workers.sh" > workers.log 2>&1 & echo $! >> daskmeans-cluster.pids
echo "scheduler file: $DASKMEANS_SHARED/scheduler.json (logs: scheduler.log, workers.log)"
