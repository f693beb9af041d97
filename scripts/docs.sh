#!/usr/bin/env bash
# The documentation site (docs/, Sphinx + myst-parser + the PyData theme; docs/about.md says why).
#   bash scripts/docs.sh          build strictly, then serve it at http://127.0.0.1:8000 (PORT=... to move it)
#   bash scripts/docs.sh build    build strictly into docs/_build/html and stop (what tests/commands/test_docs.py runs)
# Strict (-n -W): every Sphinx warning is an error (a link to a missing page or anchor, a page outside every
# toctree, a docstring that does not parse, a reference to a cblight object the API reference lacks). Needs the docs extra (pip install -e ".[docs]"; scripts/setup.sh's test
# profile installs it). Uses .venv/bin/python when there is one, else $PYTHON or python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=${PYTHON:-python3}; fi
if ! "$PYTHON" -c 'import sphinx, myst_parser, pydata_sphinx_theme, sphinx_copybutton, importlib; importlib.import_module("sphinx-mathjax-offline")' 2>/dev/null; then
    echo "docs.sh: the docs extra is not installed for $PYTHON: run $PYTHON -m pip install -e '.[docs]'" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out=docs/_build/html
case "${1:-serve}" in
    build) exec "$PYTHON" -m sphinx -n -W --keep-going -q -b html -d docs/_build/doctrees docs "$out" ;;
    serve)
        "$PYTHON" -m sphinx -n -W --keep-going -q -b html -d docs/_build/doctrees docs "$out"
        echo "docs.sh: serving $out at http://127.0.0.1:${PORT:-8000} (Ctrl-C stops)"
        exec "$PYTHON" -m http.server "${PORT:-8000}" --bind 127.0.0.1 --directory "$out" ;;
    *) echo "usage: bash scripts/docs.sh [serve|build]" >&2; exit 2 ;;
esac
