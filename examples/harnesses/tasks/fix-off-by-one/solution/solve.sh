#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
cat > window.py <<'EOF'
def last_n(items: list, n: int) -> list:
    """The last n items of items."""
    if n <= 0:
        return []
    return items[-n:]
EOF
