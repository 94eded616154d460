#!/usr/bin/env bash
# On a host with a package index: put daskmeans and every package it needs, as wheels, in
# OUT, for install.sh on hosts without one (or the Docker build, deploy/docker).
#
#   build-wheelhouse.sh OUT [--extras cuda13|cuda12] [--python-version 3.12] [--platform manylinux_2_28_x86_64]
#
# Without --python-version/--platform the wheels are for this host's Python and platform.
set -euo pipefail
if [ $# -lt 1 ] || [ "${1:0:1}" = - ]; then
  echo "usage: build-wheelhouse.sh OUT [--extras E] [--python-version X.Y] [--platform TAG]" >&2; exit 2
fi
out=$1; shift
extras=
target=()
while [ $# -gt 0 ]; do
  case $1 in
    --extras) extras="[$2]"; shift 2 ;;
    --python-version|--platform) target+=("$1" "$2"); shift 2 ;;
    *) echo "build-wheelhouse.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" "$here"
version=$(python3 -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['project']['version'])" "$here/pyproject.toml")
if [ ${#target[@]} -ne 0 ]; then target+=(--only-binary=:all:); fi
python3 -m pip download --quiet --dest "$out" --find-links "$out" "${target[@]}" "daskmeans${extras}==${version}" pip
echo "$(find "$out" -maxdepth 1 -name '*.whl' | wc -l) wheels in $out (daskmeans $version${extras})"
