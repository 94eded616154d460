#!/usr/bin/env bash
# One dask-cuda worker per visible GPU on this host, joined to $DASKMEANS_SHARED/scheduler.json.
set -euo pipefail
shared=${DASKMEANS_SHARED:-$PWD}
exec dask cuda worker --scheduler-file "$shared/scheduler.json" "$@"
