#!/bin/sh
# Start one container of a Redis pod: `start.sh redis` or `start.sh sentinel`.
#
# The primary is whoever the sentinels name (after a failover that may be any pod); when no
# sentinel answers - the StatefulSet's first start - pod 0 is the primary. Each start writes
# its config, with the password, to the pod's in-memory /conf volume: no password in the
# manifests or on a command line. Addresses are pod hostnames in the headless Service, which
# Redis and Sentinel announce as they are (announce-hostnames).
set -eu

role="$1"
conf="${CONF_DIR:-/conf}"
domain="redis-headless.${POD_NAMESPACE}.svc"
self="${HOSTNAME}.${domain}"

primary=""
for i in 0 1 2; do
    answer="$(redis-cli --no-auth-warning -h "redis-$i.$domain" -p 26379 \
        sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null | head -n 1)" || answer=""
    case "$answer" in
        redis-*."$domain") primary="$answer"; break ;;
    esac
done
[ -n "$primary" ] || primary="redis-0.$domain"

umask 077
case "$role" in
redis)
    {
        echo "port 6379"
        echo "dir /data"
        echo "appendonly yes"
        echo "maxmemory $REDIS_MAXMEMORY"
        echo "maxmemory-policy noeviction"
        echo "stream-node-max-bytes 65536"
        echo "replica-announce-ip $self"
        echo "requirepass $REDISCLI_AUTH"
        echo "masterauth $REDISCLI_AUTH"
        if [ "$primary" != "$self" ]; then echo "replicaof $primary 6379"; fi
    } > "$conf/redis.conf"
    exec redis-server "$conf/redis.conf"
    ;;
sentinel)
    {
        echo "port 26379"
        echo "dir $conf"
        echo "sentinel resolve-hostnames yes"
        echo "sentinel announce-hostnames yes"
        echo "sentinel announce-ip $self"
        echo "requirepass $REDISCLI_AUTH"
        echo "sentinel monitor $MASTER_NAME $primary 6379 2"
        echo "sentinel auth-pass $MASTER_NAME $REDISCLI_AUTH"
        echo "sentinel down-after-milliseconds $MASTER_NAME 5000"
        echo "sentinel failover-timeout $MASTER_NAME 60000"
        echo "sentinel parallel-syncs $MASTER_NAME 1"
    } > "$conf/sentinel.conf"
    exec redis-sentinel "$conf/sentinel.conf"
    ;;
*)
    echo "usage: start.sh redis|sentinel" >&2
    exit 2
    ;;
esac
