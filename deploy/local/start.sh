#!/usr/bin/env bash
# Start a Dask scheduler and workers on this host as plain background processes, for
# `daskmeans ... --scheduler-file DIR/scheduler.json`. Stop them with stop.sh DIR.
#
#   start.sh [--dir DIR] [--workers N] [--cpu | --gpu] [--host ADDR]
#            [--tls-ca-file CA --tls-cert CERT --tls-key KEY] [-- EXTRA WORKER ARGS]
#
# --dir      where the scheduler file, logs and PIDs go (default ./daskmeans-cluster)
# --workers  CPU workers (one single-threaded process each; default: one per core);
#            GPU workers are one per visible GPU (CUDA_VISIBLE_DEVICES chooses them)
# --cpu/--gpu  worker kind (default: GPU when nvidia-smi lists a GPU and dask-cuda imports)
# --host     the address the scheduler and workers listen on (default 127.0.0.1: this host
#            only). Any other address lets other hosts connect: use TLS there.
# --tls-*    PEM files: the scheduler and workers then speak tls:// and accept only peers
#            with certificates of that authority (clients need the same three flags)
set -euo pipefail

dir=daskmeans-cluster
workers=
kind=auto
host=127.0.0.1
tls=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --cpu) kind=cpu; shift ;;
    --gpu) kind=gpu; shift ;;
    --host) host=$2; shift 2 ;;
    --tls-ca-file|--tls-cert|--tls-key) tls+=("$1" "$(realpath "$2")"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ${#tls[@]} -ne 0 ] && [ ${#tls[@]} -ne 6 ]; then
  echo "start.sh: TLS needs --tls-ca-file, --tls-cert and --tls-key together" >&2; exit 2
fi
protocol=tcp
[ ${#tls[@]} -eq 6 ] && protocol=tls

if [ "$kind" = auto ]; then
  kind=cpu
  if nvidia-smi -L >/dev/null 2>&1 && python3 -c "import dask_cuda" >/dev/null 2>&1; then kind=gpu; fi
fi

mkdir -p "$dir"
dir=$(realpath "$dir")
if [ -e "$dir/pids" ]; then
  echo "start.sh: $dir/pids exists: a cluster started there may still run (stop.sh $dir first)" >&2; exit 1
fi
rm -f "$dir/scheduler.json"

# Each process leads its own process group (setsid), so stop.sh can end it with its children
# (a worker's nanny and worker processes) and nothing else.
start() {  # start LOG CMD...: in the background; its PID to $dir/pids
  local log=$1; shift
  setsid "$@" >"$dir/$log" 2>&1 </dev/null &
  echo $! >>"$dir/pids"
}

start scheduler.log dask scheduler --scheduler-file "$dir/scheduler.json" --protocol "$protocol" \
  --host "$host" --port 0 --dashboard-address "$host:0" "${tls[@]}"
for _ in $(seq 300); do [ -s "$dir/scheduler.json" ] && break; sleep 0.1; done
if [ ! -s "$dir/scheduler.json" ]; then
  echo "start.sh: the scheduler did not start; see $dir/scheduler.log" >&2; exit 1
fi

if [ "$kind" = gpu ]; then
  n=$(nvidia-smi -L | wc -l)
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then n=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi
  start workers.log dask cuda worker --scheduler-file "$dir/scheduler.json" --host "$host" \
    --dashboard-address "$host:0" --preload daskmeans.preload "${tls[@]}" "$@"
else
  n=${workers:-$(nproc)}
  for i in $(seq "$n"); do
    start "worker-$i.log" dask worker --scheduler-file "$dir/scheduler.json" --host "$host" --nthreads 1 \
      --dashboard-address "$host:0" --name "cpu-$i" "${tls[@]}" "$@"
  done
fi

# Ready when every worker has joined (a client with the same certificates asks).
if ! python3 - "$dir/scheduler.json" "$n" "${tls[@]}" <<'PY'
import sys
from distributed import Client
from distributed.security import Security

file, n, tls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
opts = dict(zip(tls[::2], tls[1::2]))
sec = Security(tls_ca_file=opts["--tls-ca-file"], tls_client_cert=opts["--tls-cert"],
               tls_client_key=opts["--tls-key"], require_encryption=True) if opts else None
with Client(scheduler_file=file, security=sec, timeout="60s") as c:
    c.wait_for_workers(n, timeout=120)
PY
then
  echo "start.sh: the workers did not all join; see $dir/*.log (stop.sh $dir cleans up)" >&2; exit 1
fi
address=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['address'])" "$dir/scheduler.json")
echo "$n $kind worker(s) on $address"
echo "  daskmeans fit DATA --k K --scheduler-file $dir/scheduler.json${tls[*]:+ ${tls[*]}}"
echo "  stop: $(dirname "$0")/stop.sh $dir"
