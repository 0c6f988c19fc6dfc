#!/usr/bin/env bash
# Run the test suite: bootstrap the machine if needed, then pytest with any arguments given.
#   scripts/test.sh                       # everything
#   scripts/test.sh -m "not integration"  # no RabbitMQ/Redis needed
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
