#!/usr/bin/env bash
# Run the whole fleet end to end on this machine, no Docker: installs what is missing
# (scripts/bootstrap.sh), then starts RabbitMQ, Redis, demo sites and 2 workers, seeds URLs,
# prints a summary and stops everything. Extra arguments go to devtools/local_fleet.py
# (e.g. --workers 4 --pages 500).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
exec .venv/bin/python -m devtools.local_fleet "$@"
