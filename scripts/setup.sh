#!/usr/bin/env bash
# Create .venv and install cblight with its test tools. Idempotent: reinstalls only when pyproject.toml
# changed. torch==2.13.0 goes first so that no CUDA wheels are pulled in on CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.cblight-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[dev,models,serve]"
    echo "$want" > "$stamp"
fi
