#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
cat > fizzbuzz.py <<'EOF'
def fizzbuzz(n: int) -> str:
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
EOF
