#!/usr/bin/env bash
# Creates .venv in the checkout and installs reinforge with its test tools and the agent frameworks
# it is tested with (the [frameworks] extra; `pip check` must stay clean).
# torch==2.13.0 goes first: installed later, a dependency would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,frameworks]"
.venv/bin/python -m pip check
