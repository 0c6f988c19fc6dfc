"""The fleet's status: one snapshot dict (for --json; its keys: common/ops/status_view.py) and
the live view; the renderings are in common/ops/status_view.py.

Sources: queue depths by passive declares (always) and, when the management API answers,
unacked counts and rates per queue; Redis for everything else — counters (stats:counters),
outcomes, results per sink, dead letters now and ever and what is to do
(common/ops/status_counts.py), the crawl's progress (done / failed / to do, outcomes/s and an
ETA: common/ops/crawl_progress.py), the rate-limit logs (requests per domain in the current window), worker heartbeats, and
backpressure: Redis memory against maxmemory and the sinks' backlog against the watermarks
(common/store/backlog.py, common/work/pressure.py), which workers are paused and why, and a
plain warning when results are being dropped (no sink registered and the ``results`` stream at
its RESULTS_MAXLEN cap).
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pika
import redis
import requests

from common.broker import topology
from common.core.config import Settings
from common.intake.defer import deferred_status
from common.ops import crawl_progress, status_counts
from common.ops.status_view import fitted_size, render, render_rich, worker_state
from common.store.backlog import read_fill
from common.store.dedupe import SeenSet
from common.store.keys import RESULTS_STREAM
from common.store.workers import alive_workers
from common.web.ratelimit import RateLimiter
from common.work.pressure import BACKLOG, MEMORY

__all__ = ["collect", "render", "render_rich", "watch", "worker_state"]

logger = logging.getLogger(__name__)

#: "At the cap": the stream is capped with an approximate MAXLEN, so it hovers around it.
DROPPING_AT = 0.9
USER_CODE_STOPS = ("regex_timeouts", "extractor_timeouts", "extractor_crashes")  # keys.py


def _management(settings: Settings) -> tuple[str, tuple[str, str]] | None:
    """Management API base URL and credentials: RABBITMQ_MANAGEMENT_URL (a list: a cluster's
    nodes), else port 15672 of each broker address. With several, the first that answers
    /api/overview (any node serves the whole cluster's figures); None when none does."""
    amqp = pika.URLParameters(settings.rabbitmq_url)
    creds = (amqp.credentials.username, amqp.credentials.password)
    candidates = []
    for url in (settings.rabbitmq_management_url or "").split(","):
        if url:
            parts = urlsplit(url)
            found = ((unquote(parts.username), unquote(parts.password or "")) if parts.username
                     else creds)
            candidates.append((f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}",
                               found))
    if not candidates:
        hosts = dict.fromkeys(pika.URLParameters(url).host for url in settings.rabbitmq_urls)
        candidates = [(f"http://{host}:15672", creds) for host in hosts]
    if len(candidates) == 1:
        return candidates[0]
    for base, auth in candidates:
        try:
            requests.get(f"{base}/api/overview", auth=auth, timeout=2).raise_for_status()
            return base, auth
        except requests.RequestException as exc:
            logger.debug("management API at %s unavailable (%s); trying the next", base, exc)
    return None


def _management_queues(settings: Settings) -> dict[str, dict[str, Any]]:
    found = _management(settings)
    if found is None:
        return {}
    base, creds = found
    vhost = quote(pika.URLParameters(settings.rabbitmq_url).virtual_host, safe="")
    try:
        response = requests.get(f"{base}/api/queues/{vhost}", auth=creds, timeout=2)
        response.raise_for_status()
        return {q["name"]: q for q in response.json()}
    except (requests.RequestException, ValueError) as exc:
        logger.debug("management API unavailable (%s); showing ready counts only", exc)
        return {}


def _rate(details: dict[str, Any] | None) -> float:
    return round(float((details or {}).get("rate", 0.0)), 2)


def collect(settings: Settings, connection: pika.BlockingConnection, client: redis.Redis,
            previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One snapshot of the fleet, as a JSON-ready dict (its keys: common/ops/status_view.py);
    ``previous``: the last refresh's snapshot (``--watch``)."""
    # The URLs known first, then the outcomes, then what is left: a URL found meanwhile (crawl
    # mode) is then in the queue, not yet known (the total takes the larger), rather than
    # known and nowhere; a URL finishing meanwhile is in neither (``other`` for a moment).
    seen = SeenSet(client, settings.seen_buckets).count()
    finished, results = status_counts.outcomes_and_results(client)
    channel = connection.channel()
    topology.declare(channel, settings.queue_type)
    managed = _management_queues(settings)
    queues: dict[str, dict[str, Any]] = {}
    delayed = 0
    for spec in topology.QUEUES:
        ok = channel.queue_declare(queue=spec.name, passive=True).method
        if spec.name.startswith("hold."):
            delayed += ok.message_count
            continue
        info = managed.get(spec.name, {})
        stats = info.get("message_stats", {})
        queues[spec.name] = {
            "ready": ok.message_count, "consumers": ok.consumer_count,
            "unacked": info.get("messages_unacknowledged"),
            "publish_rate": _rate(stats.get("publish_details")) if info else None,
            "deliver_rate": _rate(stats.get("deliver_get_details")) if info else None,
        }
    channel.close()

    counters = status_counts.counters(client)  # on a Redis Cluster: its parts, summed
    hits, misses = counters.get("cache_hits", 0), counters.get("cache_misses", 0)
    workers = alive_workers(client)
    for worker in workers:
        age = round(max(0.0, time.time() - worker.get("beat", time.time())), 1)
        worker["beat_age_s"] = age
        worker["stale"] = age > 2 * worker.get("interval_s", 5)
    to_do = status_counts.to_do(client, queues, delayed, workers, seen=seen, finished=finished)
    progress = crawl_progress.measure(client, seen=seen, finished=finished,
                                      results=results["recorded"], to_do=to_do["total"])
    dead = status_counts.dead_letters(connection, counters,
                                      queues[topology.FAILED_QUEUE]["ready"],
                                      (previous or {}).get("dead_letters"))
    return {
        "queues": queues,
        "delayed": delayed,
        "to_do": to_do,
        "dead_letters": dead,
        "dead_lettered": dead["now"],
        "dead_lettered_by_reason": dead["ever_by_reason"],
        "expired": counters.get("expired", 0),
        "expired_waiting": queues[topology.EXPIRED_QUEUE]["ready"],
        "seen": seen,
        "results": results["recorded"],
        "results_detail": results,
        "pages_per_s_last_minute": progress["pages_per_s"],
        "progress": progress,
        "cache": {"hits": hits, "misses": misses,
                  "hit_ratio": round(hits / (hits + misses), 3) if hits + misses else None},
        "robots_blocked": counters.get("robots_blocked", 0),
        "rate_limited": counters.get("rate_limited", 0),
        "retries": counters.get("retries", 0),
        "user_code_stopped": {k: counters[k] for k in USER_CODE_STOPS if counters.get(k)},
        "domains": _domain_rates(settings, client, crawl_progress.redis_now_ms(client)),
        "throttled": RateLimiter(client, settings).throttled(),
        "deferred": deferred_status(client),
        "jobs": status_counts.jobs(client),
        "proxies": status_counts.proxies(client),
        "workers": workers,
        "pressure": _pressure(settings, client, workers),
        "counters": counters,
    }


def _pressure(settings: Settings, client: redis.Redis,
              workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Redis memory and the sinks' backlog against the watermarks; who is paused and why."""
    fill = read_fill(client)
    ratio = fill.memory_ratio
    memory = {"used": fill.used_memory, "max": fill.maxmemory,
              "ratio": None if ratio is None else round(ratio, 4),
              "high": settings.redis_memory_high, "low": settings.redis_memory_low,
              "over_high": ratio is not None and ratio > settings.redis_memory_high}
    backlog = {"entries": fill.backlog, "sink": fill.backlog_sink, "by_sink": fill.sinks,
               "high": settings.results_backlog_high, "low": settings.results_backlog_low,
               "over_high": fill.backlog > settings.results_backlog_high}
    states = {w["id"]: w.get("pressure") or {} for w in workers}
    paused_workers = {wid: p["reason"] for wid, p in states.items() if p.get("paused")}
    reasons = [MEMORY] if memory["over_high"] else []
    reasons += [BACKLOG] if backlog["over_high"] else []
    reasons += sorted(set(paused_workers.values()) - set(reasons))
    length = fill.lengths[RESULTS_STREAM]
    dropping = not fill.sinks and length >= DROPPING_AT * settings.results_maxlen
    warnings = [f"results are being dropped: the results stream holds {length:,} entries, at "
                f"its cap RESULTS_MAXLEN={settings.results_maxlen:,}, and no sink is "
                "registered, so results older than the cap are trimmed away; export them "
                "(export.py) or register a sink"] if dropping else []
    return {"paused": reasons, "paused_workers": paused_workers,
            "unhealthy_workers": {wid: p["unhealthy"] for wid, p in states.items()
                                  if p.get("unhealthy")},
            "redis_memory": memory, "results_backlog": backlog,
            "results_dropping": dropping, "warnings": warnings}


def _domain_rates(settings: Settings, client: redis.Redis, now_ms: int) -> list[dict[str, Any]]:
    """Requests per domain in its current window, against its configured limit."""
    limiter = RateLimiter(client, settings)
    rows = []
    for key in client.scan_iter(match="ratelimit:*", count=1000):
        name = key.decode()
        if name.endswith(":next"):
            continue
        domain = name.split(":", 1)[1]
        if domain.startswith("{"):  # a Redis Cluster's shard tag (common/store/slots.py)
            domain = domain.split(":", 1)[1]
        rate = limiter.rate_for(domain)
        used = client.zcount(name, now_ms - rate.window_ms, "+inf")
        rows.append({"domain": domain, "requests_in_window": used, "limit": rate.amount,
                     "window_s": rate.window_ms / 1000})
    return sorted(rows, key=lambda r: (-r["requests_in_window"], r["domain"]))[:50]


def watch(settings: Settings, connection: pika.BlockingConnection, client: redis.Redis,
          interval_s: float = 2.0) -> None:
    """Refresh the live view, fitted to the terminal, until Ctrl-C. Each refresh stores its
    reading of the outcome counters, so the rate is over the last minute of refreshes."""
    from rich.live import Live

    def view(snapshot: dict[str, Any]) -> Any:
        width, height = fitted_size()
        # One line fewer than the terminal: the cursor's line below the view.
        return render_rich(snapshot, width, None if height is None else max(1, height - 1))

    snapshot = collect(settings, connection, client)
    with Live(view(snapshot), refresh_per_second=4) as live:
        while True:
            time.sleep(interval_s)
            snapshot = collect(settings, connection, client, snapshot)
            live.update(view(snapshot))
