#!/usr/bin/env bash
# A Python environment with TensorBoard, for the test that reads kiln's event files with
# TensorBoard's own reader (tests/it/tools.rs). Prints the python to use. Idempotent.
#   KILN_TB_VENV: where the environment lives (default: ~/.cache/kiln/tb-venv)
set -euo pipefail
VENV="${KILN_TB_VENV:-$HOME/.cache/kiln/tb-venv}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
  else
    echo "tensorboard-up: python3 -m venv is missing (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check tensorboard >&2
"$VENV/bin/python" -c "import tensorboard" >&2
echo "$VENV/bin/python"
