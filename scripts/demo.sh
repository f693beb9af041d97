#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the offline demo: a tiny random model built locally, the bundled
# sample data, boosted evaluation with its table, results.json and plots. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m cblight.demo "$@"
