#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
awk -F, 'NR > 1 { s += $3 } END { print s }' data.csv > total.txt
