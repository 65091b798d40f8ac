#!/usr/bin/env bash
# Installs Codex CLI (npm @openai/codex) and OpenCode (npm opencode-ai), pinned, into .harness-bin/ of
# the checkout, for tests/harnesses and reinforge.harnesses.CodexCli / OpenCode (docs/harnesses.md).
# Idempotent: a matching version is left as it is. Without npm it says so and exits 0 (those tests
# then skip). Both ship a native binary in a per-platform optional dependency that npm picks for this
# machine; the script checks each one starts (`--version`).
set -euo pipefail
cd "$(dirname "$0")/.."
CODEX=${CODEX_VERSION:-0.171.0}
OPENCODE=${OPENCODE_VERSION:-1.18.33}
PREFIX=.harness-bin
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm is not installed: Codex CLI and OpenCode are not installed" \
    "(tests/harnesses/test_codex_cli.py and test_opencode.py skip)" >&2
  exit 0
fi
installed() {  # package.json path, version
  [ -f "$1" ] && grep -q "\"version\": \"$2\"" "$1"
}
install() {  # package spec, command, label
  npm install --global --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "$1" >/dev/null
  if ! "$PREFIX/bin/$2" --version >/dev/null 2>&1; then
    echo "setup: $3 installed but '$PREFIX/bin/$2 --version' fails (its native binary for" \
      "$(uname -m) missing?)" >&2
    exit 1
  fi
  echo "setup: $3 installed in $PREFIX/bin/$2"
}
if ! installed "$PREFIX/lib/node_modules/@openai/codex/package.json" "$CODEX"; then
  install "@openai/codex@$CODEX" codex "Codex CLI $CODEX"
fi
if ! installed "$PREFIX/lib/node_modules/opencode-ai/package.json" "$OPENCODE"; then
  install "opencode-ai@$OPENCODE" opencode "OpenCode $OPENCODE"
fi
