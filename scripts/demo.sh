#!/usr/bin/env bash
# Set up .venv (`setup.sh demo`: cblight and the offline models, no test tools) and run the offline demo
# (cblight demo): the paper's whole loop on SmolLM2-135M from the offline zoo and the real benchmark samples
# shipped in cblight/assets/realdata, each step's results.json, predictions and plots under outputs/demo/.
# Extra arguments go to the demo (--quick, --model gemma3-270m, --model tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m cblight demo "$@"
