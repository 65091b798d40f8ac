#!/usr/bin/env bash
# Installs Claude Code (npm @anthropic-ai/claude-code, pinned) into .harness-bin/ of the checkout, for
# tests/harnesses and reinforge.harnesses.ClaudeCode (docs/harnesses.md). Idempotent: a matching
# version is left as it is. Without npm it says so and exits 0 (those tests then skip).
# 2.1.112 is the last release that ships cli.js (runs on Node 18+); later ones ship a native binary
# in a per-platform package whose installer wants Node 22.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CLAUDE_CODE_VERSION:-2.1.112}
PREFIX=.harness-bin
PACKAGE="$PREFIX/lib/node_modules/@anthropic-ai/claude-code/package.json"
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm is not installed: Claude Code is not installed (tests/harnesses/test_claude_code.py skips)" >&2
  exit 0
fi
if [ -f "$PACKAGE" ] && grep -q "\"version\": \"$VERSION\"" "$PACKAGE"; then
  exit 0
fi
npm install --global --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$VERSION" >/dev/null
echo "setup: Claude Code $VERSION installed in $PREFIX/bin/claude"
