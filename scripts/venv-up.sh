#!/usr/bin/env bash
# A Python virtual environment with some packages, made once and reused. Prints its python.
#   scripts/venv-up.sh DIR MODULES PACKAGE...
# DIR: where it lives; MODULES: comma-separated modules that must import (else the packages are
# installed); PACKAGE...: what pip installs. Idempotent.
set -euo pipefail
VENV="$1"
MODULES="$2"
shift 2
imports="import ${MODULES}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$imports" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
  else
    echo "venv-up: python3 -m venv is missing (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check "$@" >&2
"$VENV/bin/python" -c "$imports" >&2
echo "$VENV/bin/python"
