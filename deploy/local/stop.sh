#!/usr/bin/env bash
# Stop the processes that start.sh started in DIR (default ./daskmeans-cluster), and only
# those: each PID in DIR/pids leads a process group holding one scheduler or worker and its
# children. SIGTERM first (workers close cleanly), SIGKILL after 10 s.
set -euo pipefail
dir=${1:-daskmeans-cluster}
if [ ! -f "$dir/pids" ]; then
  echo "stop.sh: $dir/pids not found: nothing started there" >&2; exit 1
fi
mapfile -t pids <"$dir/pids"
alive() { kill -0 -- "-$1" 2>/dev/null; }
# Workers first, the scheduler (the first PID) last, so the workers do not wait for it.
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
  alive "${pids[i]}" && kill -TERM -- "-${pids[i]}" 2>/dev/null || true
done
for _ in $(seq 100); do
  left=0
  for p in "${pids[@]}"; do alive "$p" && left=1; done
  [ $left -eq 0 ] && break
  sleep 0.1
done
for p in "${pids[@]}"; do alive "$p" && kill -KILL -- "-$p" 2>/dev/null || true; done
rm -f "$dir/pids" "$dir/scheduler.json"
echo "stopped ${#pids[@]} process group(s) of $dir"
