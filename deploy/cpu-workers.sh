#!/usr/bin/env bash
# One single-threaded worker per core (BLAS and the engine do not oversubscribe the cores).
set -euo pipefail
shared=${DASKMEANS_SHARED:-$PWD}
exec dask worker --scheduler-file "$shared/scheduler.json" --nworkers "$(nproc)" --nthreads 1 "$@"
