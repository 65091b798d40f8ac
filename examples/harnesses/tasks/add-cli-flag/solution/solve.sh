#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
cat > greet.py <<'EOF'
import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description="Print a greeting.")
    parser.add_argument("--name", default="world")
    parser.add_argument("--shout", action="store_true", help="print in upper case")
    args = parser.parse_args()
    message = f"Hello, {args.name}!"
    print(message.upper() if args.shout else message)


if __name__ == "__main__":
    main()
EOF
