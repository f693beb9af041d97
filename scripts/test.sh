#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the test suite offline. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
exec .venv/bin/python -m pytest -q "$@"
