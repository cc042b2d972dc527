#!/usr/bin/env bash
# A Python environment with MLflow, whose tracking server the MLflow tests start
# (tests/it/tracking.rs: `mlflow server`). Prints the python to use. Idempotent.
#   KILN_MLFLOW_VENV: where the environment lives (default: ~/.cache/kiln/mlflow-venv)
set -euo pipefail
exec bash "$(dirname "$0")/venv-up.sh" "${KILN_MLFLOW_VENV:-$HOME/.cache/kiln/mlflow-venv}" mlflow mlflow
