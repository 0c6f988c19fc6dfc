"""Fleet statistics: queue depths, dead letters, seen-set size, results — for `stats.py`."""

from __future__ import annotations

from typing import Any

import pika
import redis

from common import topology
from common.config import Settings
from common.dedupe import SeenSet
from common.keys import COUNTERS
from common.results import ResultStore


def collect(settings: Settings, connection: pika.BlockingConnection,
            client: redis.Redis) -> dict[str, Any]:
    """One snapshot of the fleet, as a JSON-ready dict."""
    channel = connection.channel()
    topology.declare(channel)
    queues: dict[str, dict[str, int]] = {}
    held = 0
    for spec in topology.QUEUES:
        ok = channel.queue_declare(queue=spec.name, passive=True).method
        if spec.name.startswith("hold."):
            held += ok.message_count
            continue
        queues[spec.name] = {"ready": ok.message_count, "consumers": ok.consumer_count}
    channel.close()
    counters = {k.decode(): int(v) for k, v in client.hgetall(COUNTERS).items()}
    return {
        "queues": queues,
        "dead_lettered": queues[topology.FAILED_QUEUE]["ready"],
        "expired": queues[topology.EXPIRED_QUEUE]["ready"],
        "delayed": held,
        "seen": SeenSet(client, settings.seen_buckets).count(),
        "results": ResultStore(client, settings.results_maxlen).count(),
        "counters": counters,
    }


def render(snapshot: dict[str, Any]) -> str:
    """A short human-readable table."""
    lines = [f"{'queue':<16}{'ready':>10}{'consumers':>11}"]
    for name, q in snapshot["queues"].items():
        lines.append(f"{name:<16}{q['ready']:>10}{q['consumers']:>11}")
    lines.append(f"seen URLs: {snapshot['seen']}   results: {snapshot['results']}   "
                 f"dead-lettered: {snapshot['dead_lettered']}   delayed: {snapshot['delayed']}   "
                 f"expired (waiting release): {snapshot['expired']}")
    counters = snapshot["counters"]
    hits, misses = counters.get("cache_hits", 0), counters.get("cache_misses", 0)
    if hits or misses:
        lines.append(f"cache: hits={hits} misses={misses} "
                     f"hit_ratio={hits / (hits + misses):.2f}")
    if snapshot["counters"]:
        lines.append("counters: " + " ".join(f"{k}={v}" for k, v in
                                             sorted(snapshot["counters"].items())))
    return "\n".join(lines)
