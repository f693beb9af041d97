#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the tests offline: the tiny-model suite, then the distributed tier
# (2 CPU processes: FSDP2 and DDP against one process, the 2-node torchrun launch, sharded evaluate and
# generate, the documentation's multi-GPU commands), then the real-model tier (pretrained SmolLM2 and
# Gemma-3 from the offline zoo's wheels, converted once, also by the documentation's `cblight zoo` commands).
# Extra arguments go to pytest instead (one run, e.g. `bash scripts/test.sh -k evaluate` or
# `bash scripts/test.sh -m distributed`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
# --durations: the slowest tests of each tier in the log, so CI shows where the time goes. The tiny suite runs
# in two pytest-xdist workers of one thread each (a test file stays in one worker, with its module fixtures):
# many of its tests wait on a subprocess, so one worker leaves a core idle.
.venv/bin/python -m pytest -q --durations=25 -n 2 --dist loadfile
.venv/bin/python -m pytest -q --durations=25 -m distributed
exec .venv/bin/python -m pytest -q --durations=25 -m realmodel tests/realmodel
