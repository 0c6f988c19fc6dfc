#!/usr/bin/env bash
# Chaos run on this machine, no Docker: installs what is missing (scripts/bootstrap.sh), then
# crawls local demo sites while it kills workers with kill -9, restarts RabbitMQ and restarts
# Redis, and prints URLs in / results / dead-lettered / lost / duplicates. Exits non-zero if a
# URL was lost or got two outcomes. Extra arguments go to devtools/chaos.py
# (e.g. --urls 3000 --workers 3 --duration-cap 300).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
exec .venv/bin/python -m devtools.chaos "$@"
