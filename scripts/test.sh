#!/usr/bin/env bash
# Run the test suite: bootstrap the machine if needed, then pytest with any arguments given.
#   scripts/test.sh                       # everything
#   scripts/test.sh -m "not integration"  # no RabbitMQ/Redis needed
#   scripts/test.sh tests/test_faults.py  # the tests named, in one pytest process
#
# Two pytest processes at once, unless a test path is given or RABBITMQ_URL(S)/REDIS_URL/
# POSTGRES_URL name servers the two would share: the files in WAITING (tests that mostly wait:
# rate-paced crawls, outages, leases, fleets booting) run in a second process in the background
# with their own servers, temp dirs and ports, while the main process runs everything else.
# Both get the same arguments. The second one's output follows the main one's. Exit status: the
# first of the two that is neither 0 nor 5; 5 ("no tests collected") only when both are 5.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh
# The bench's own venv (its peers), wanted by tests/test_bench.py halfway through: installed in
# the background meanwhile; the bench waits for it (bench/venv.sh takes a lock).
if command -v flock >/dev/null 2>&1; then
    bash bench/venv.sh > .venv/bench-venv.log 2>&1 &
fi

WAITING=(
    tests/test_cluster_node_loss.py
    tests/test_sentinel_failover.py
    tests/store/test_sentinel.py
    tests/test_fairness.py
    tests/test_scheduler_fleet.py
    tests/ops/test_local_secrets.py
    tests/ops/test_local_mode.py
    tests/test_faults.py
    tests/test_poison.py
    tests/work/test_pressure.py
    tests/intake/test_producer_faults.py
    tests/test_jobs_fleet.py
    tests/test_jobs_fairness.py
    tests/test_proxies_fleet.py
    tests/test_sessions_fleet.py
    tests/test_login_fleet.py
    tests/test_render_fleet.py
    tests/test_render_faults.py
    tests/web/test_browser_features.py
    tests/web/test_browser_renderer.py
    tests/media/test_media_fleet.py
    tests/media/test_tools.py
    tests/media/test_download.py
    tests/test_media_cost.py
    tests/sink/test_assets_sinks.py
    tests/test_adaptive_politeness.py
    tests/test_redis_cluster_fleet.py
    tests/ops/test_dlq_cluster.py
)

split=1
for arg in "$@"; do
    case "$arg" in
        --junit*|--result-log*) split=0 ;;  # one report file: two processes would overwrite it
    esac
    if [ -e "${arg%%::*}" ]; then
        split=0  # a test path: the tests named, as asked, in one process
    fi
done
if [ -n "${RABBITMQ_URL:-}${RABBITMQ_URLS:-}${REDIS_URL:-}${POSTGRES_URL:-}" ]; then
    split=0  # one set of servers: two sessions would flush each other's state
fi
if [ "$split" -eq 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi

side_log="$(mktemp -t scrape-fleet-tests.XXXXXX)"
show_waiting() {
    echo
    echo "== the second pytest process: ${WAITING[*]} ($1) =="
    cat "$side_log"
    rm -f "$side_log"
}
# Job control for this one command: the background pytest gets its own process group with
# SIGINT at its default, so that an interrupt stops it through pytest (its servers torn down).
set -m
.venv/bin/python -m pytest -o cache_dir=.pytest_cache/waiting --durations=15 "$@" "${WAITING[@]}" \
    < /dev/null > "$side_log" 2>&1 &
side=$!
set +m
trap 'kill -INT "$side" 2>/dev/null || true; wait "$side" 2>/dev/null || true; show_waiting interrupted' EXIT
trap 'exit 130' INT TERM
echo "test.sh: ${WAITING[*]} run in a second pytest process (pid $side); its output follows" >&2

ignores=()
for path in "${WAITING[@]}"; do
    ignores+=("--ignore=$path")
done
main=0
.venv/bin/python -m pytest --durations=25 "$@" "${ignores[@]}" || main=$?
waiting=0
wait "$side" || waiting=$?
trap - EXIT
show_waiting "exit $waiting"

if [ "$main" -eq 5 ] && [ "$waiting" -eq 5 ]; then
    exit 5
fi
for status in "$main" "$waiting"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        exit "$status"
    fi
done
exit 0
