#!/usr/bin/env bash
# Run the test suite: bootstrap the machine if needed, then pytest with any arguments given.
#   scripts/test.sh                       # everything
#   scripts/test.sh -m "not integration"  # no RabbitMQ/Redis needed
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
# The bench's own venv (its peers), wanted by tests/test_bench.py halfway through: installed in
# the background meanwhile; the bench waits for it (bench/venv.sh takes a lock).
if command -v flock >/dev/null 2>&1; then
    bash bench/venv.sh > .venv/bench-venv.log 2>&1 &
fi
exec .venv/bin/python -m pytest "$@"
