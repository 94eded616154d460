#!/usr/bin/env bash
# Start a Dask scheduler that writes its address to $DASKMEANS_SHARED/scheduler.json.
set -euo pipefail
shared=${DASKMEANS_SHARED:-$PWD}
exec dask scheduler --scheduler-file "$shared/scheduler.json" "$@"
