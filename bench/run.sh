#!/usr/bin/env bash
# The benchmark in one command, from a clean checkout:
#   bash bench/run.sh                 # full run (~10 sites x 2,000 pages; several minutes)
#   bash bench/run.sh --small         # tiny farm, fewer samples (what the CI test runs)
#   bash bench/run.sh --skip-peer     # no scrapy-redis (no bench venv needed)
#   bash bench/run.sh --profile       # py-spy on workers, spiders and the producer (in the JSON)
# Installs what is missing: RabbitMQ, Redis and .venv (scripts/bootstrap.sh), nginx (apt), and (bench/venv.sh)
# bench/.venv from bench/requirements-bench.lock (the runtime lock's pins plus scrapy,
# scrapy-redis, py-spy and their dependencies, all with sha256 hashes, installed with
# --require-hashes) for the peer; then runs `python -m bench.run "$@"` with the fleet's .venv.
# Prints the table; details go to bench/out/bench-<time>.json.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "bench/run.sh: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

bash scripts/bootstrap.sh >&2

if ! have nginx && [ ! -x /usr/sbin/nginx ]; then
    sudo_cmd=()
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo; then sudo_cmd=(sudo); else
            log "need root or sudo to install nginx"; exit 1
        fi
    fi
    log "installing nginx with apt-get"
    "${sudo_cmd[@]}" apt-get update >&2
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y nginx >&2
fi

skip_peer=0
for arg in "$@"; do
    [ "$arg" = "--skip-peer" ] && skip_peer=1
done

if [ "$skip_peer" -eq 0 ]; then
    bash bench/venv.sh
fi

exec .venv/bin/python -m bench.run --bench-python bench/.venv/bin/python "$@"
