#!/usr/bin/env bash
# A Python environment with TensorBoard, for the test that reads kiln's event files with
# TensorBoard's own reader (tests/it/tools.rs). Prints the python to use. Idempotent.
#   KILN_TB_VENV: where the environment lives (default: ~/.cache/kiln/tb-venv)
set -euo pipefail
exec bash "$(dirname "$0")/venv-up.sh" "${KILN_TB_VENV:-$HOME/.cache/kiln/tb-venv}" tensorboard tensorboard
