#!/usr/bin/env bash
# A Python environment with PyTorch and Hugging Face transformers, for the tests that load
# kiln's exports in transformers (tests/it/hf_llama.rs runs scripts/check-hf-llama.py), that
# compute transformers' loss on documents (tests/it/documents.rs: scripts/check-documents-loss.py),
# its chat templates (tests/it/sft.rs: scripts/check-chat-template.py, which writes parquet with
# pyarrow), PEFT's LoRA (tests/it/lora.rs: scripts/check-peft.py) and for
# the fixture scripts (scripts/make-hf-*-fixture.py). Prints the python to use. Idempotent; the
# first time it downloads torch from PyPI (about 1.5 minutes and 5.6 GB here).
#   KILN_TORCH_VENV: where the environment lives (default: ~/.cache/kiln/torch-venv)
set -euo pipefail
exec bash "$(dirname "$0")/venv-up.sh" "${KILN_TORCH_VENV:-$HOME/.cache/kiln/torch-venv}" \
  torch,transformers,safetensors,pyarrow,peft torch transformers safetensors pyarrow peft
