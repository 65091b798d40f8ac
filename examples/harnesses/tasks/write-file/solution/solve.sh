#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
printf 'Hello, reinforge!\n' > hello.txt
