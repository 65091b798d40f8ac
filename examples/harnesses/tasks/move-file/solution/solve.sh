#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
mkdir -p docs && mv notes.md docs/notes.md
