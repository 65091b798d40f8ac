#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
sed -i 's/def greeting(name: str)/def greeting(name: str = "world")/' greeting.py
