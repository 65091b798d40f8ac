#!/usr/bin/env bash
# Sets up .venv (idempotent) and runs the whole test suite. pytest's exit 5 (no tests) is a failure
# here on purpose: a suite that collects nothing is broken.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check src tests benchmarks examples
.venv/bin/python -m mypy
.venv/bin/lint-imports  # the layers of docs/architecture.md ([tool.importlinter] in pyproject.toml)
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
