#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
sed -i 's/return a - b/return a + b/' calc.py
