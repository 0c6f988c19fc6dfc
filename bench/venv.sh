#!/usr/bin/env bash
# bench/.venv for the peers (scrapy-redis, Crawlee): created with python3 -m venv and filled from
# bench/requirements-bench.lock (sha256-pinned, --require-hashes, wheels only) when the lock
# changed since the last install. One install at a time (flock on bench/.venv.lock):
# scripts/test.sh starts this in the background while the tests run, and bench/run.sh runs it
# again before the bench, waiting for that one to finish.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "bench/venv.sh: $*" >&2; }

exec 9>bench/.venv.lock
flock 9
if [ ! -x bench/.venv/bin/python ]; then
    log "creating bench/.venv with $(python3 --version)"
    python3 -m venv bench/.venv
fi
stamp=bench/.venv/.requirements.sha256
wanted="$(sha256sum < bench/requirements-bench.lock | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    log "installing bench/requirements-bench.lock into bench/.venv (hash-checked)"
    bench/.venv/bin/pip install -q --disable-pip-version-check \
        --require-hashes --only-binary=:all: -r bench/requirements-bench.lock >&2
    echo "$wanted" > "$stamp"
fi
