#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
sed -i 's/tittle_case/title_case/g' main.py
