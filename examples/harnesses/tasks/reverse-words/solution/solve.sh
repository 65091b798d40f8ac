#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
cat > words.py <<'EOF'
def reverse_words(text: str) -> str:
    return " ".join(reversed(text.split()))
EOF
