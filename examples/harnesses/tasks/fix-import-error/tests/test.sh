#!/bin/bash
# Harbor verifier. Harbor's /tests and /logs/verifier are $TESTS_DIR and $LOGS_DIR here
# (docs/harnesses.md); the working directory is the attempt's, as the harness left it.
# pytest writes a JUnit report there: the reward is the fraction of tests passed (or all-or-nothing).
export PYTHONDONTWRITEBYTECODE=1
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -c /dev/null --rootdir "$PWD" \
    --junitxml="$LOGS_DIR/junit.xml" "$TESTS_DIR"
