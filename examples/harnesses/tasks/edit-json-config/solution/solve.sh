#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
sed -i 's/"debug": false/"debug": true/; s/"port": 8000/"port": 8080/' config.json
