#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
sed -i 's/read_text()))/read_text().splitlines()))/' count.py
