#!/usr/bin/env bash
# On a host without a package index: install daskmeans from a wheelhouse built by
# build-wheelhouse.sh, into the active Python environment (a venv is advised).
#
#   install.sh WHEELHOUSE [--extras cuda13|cuda12]
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: install.sh WHEELHOUSE [--extras E]" >&2; exit 2; fi
wheels=$1; shift
extras=
if [ "${1:-}" = --extras ]; then extras="[$2]"; fi
python3 -m pip install --no-index --find-links "$wheels" "daskmeans${extras}"
daskmeans --version
