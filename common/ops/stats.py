"""The fleet's status: one snapshot dict (for --json) and its renderings (table, live view).

Sources: queue depths by passive declares (always) and, when the management API answers,
unacked counts and rates per queue; Redis for everything else — counters (stats:counters),
the crawl's progress (done / total known, pages/s, outcomes/s and an ETA:
common/ops/crawl_progress.py), the rate-limit logs (requests per domain in the current window), worker heartbeats, and
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
from rich.console import Group
from rich.table import Table

from common.broker import topology
from common.core.config import Settings
from common.intake.defer import deferred_status
from common.ops import crawl_progress
from common.ops.crawl_progress import RateHistory
from common.store.backlog import read_fill
from common.store.dedupe import SeenSet
from common.store.keys import COUNTERS, DONE_PREFIX, RESULTS_STREAM
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.work.heartbeat import alive_workers
from common.work.pressure import BACKLOG, ERRORS, MEMORY

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
            history: RateHistory | None = None) -> dict[str, Any]:
    """One snapshot of the fleet, as a JSON-ready dict (``history``: the watch loop's rate
    readings, common/ops/crawl_progress.py)."""
    # Done before what is left: a URL finishing in between is then counted in neither, not
    # in both, so done + to do stays within the URLs known.
    done = SeenSet(client, settings.seen_buckets, DONE_PREFIX).count()
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

    counters = {k.decode(): int(v) for k, v in client.hgetall(COUNTERS).items()}
    hits, misses = counters.get("cache_hits", 0), counters.get("cache_misses", 0)
    workers = alive_workers(client)
    for worker in workers:
        age = round(max(0.0, time.time() - worker.get("beat", time.time())), 1)
        worker["beat_age_s"] = age
        worker["stale"] = age > 2 * worker.get("interval_s", 5)
    seen = SeenSet(client, settings.seen_buckets).count()
    unacked = [queues[name]["unacked"] for name in topology.WORK_QUEUES]
    in_flight = (sum(unacked) if None not in unacked
                 else sum(w.get("in_flight", 0) for w in workers))
    deferred = deferred_status(client)  # waiting in Redis for their turn: to do as well
    progress = crawl_progress.measure(
        client, seen=seen, done=done, history=history, to_do=deferred["total"]
        + sum(queues[name]["ready"] for name in topology.WORK_QUEUES) + delayed + in_flight)
    return {
        "queues": queues,
        "delayed": delayed,
        "dead_lettered": queues[topology.FAILED_QUEUE]["ready"],
        "dead_lettered_by_reason": {k.split(":", 1)[1]: v for k, v in counters.items()
                                    if k.startswith("dead_lettered:")},
        "expired": counters.get("expired", 0),
        "expired_waiting": queues[topology.EXPIRED_QUEUE]["ready"],
        "seen": seen,
        "results": ResultStore(client, settings.results_maxlen).count(),
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
        "deferred": deferred,
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


def _pressure_lines(pressure: dict[str, Any]) -> list[str]:
    """The backpressure part of the table: one line for the fleet, one per warning."""
    memory, backlog = pressure["redis_memory"], pressure["results_backlog"]
    state = f"paused: {', '.join(pressure['paused'])}" if pressure["paused"] else "running"
    used = ("no maxmemory" if memory["ratio"] is None else
            f"{memory['ratio']:.2f} of maxmemory ({memory['used']:,} / {memory['max']:,} B)")
    sink = f", sink {backlog['sink']}" if backlog["sink"] else ", no sink registered"
    lines = [f"pressure: {state} | Redis memory {used}, pause above {memory['high']:g}, resume "
             f"below {memory['low']:g} | results backlog {backlog['entries']:,}{sink}, pause "
             f"above {backlog['high']:,}, resume below {backlog['low']:,}"]
    return lines + [f"WARNING: {text}" for text in pressure["warnings"]]


def worker_state(worker: dict[str, Any]) -> str:
    """A worker's pause state in words: running, or paused and why, with its figures."""
    p = worker.get("pressure") or {}
    if not p.get("paused"):
        state = "running"
    elif p["reason"] == MEMORY and p.get("memory_ratio") is not None:
        state = (f"paused: {MEMORY} ({p['memory_ratio']:.2f} of maxmemory, resume below "
                 f"{p['memory_low']:g})")
    elif p["reason"] == BACKLOG:
        state = (f"paused: {BACKLOG} ({p.get('backlog', 0):,} entries, sink "
                 f"{p.get('backlog_sink')}, resume below {p['backlog_low']:,})")
    elif p["reason"] == ERRORS:
        state = f"paused: {ERRORS} ({p.get('errors_in_a_row')} in a row)"
    else:
        state = f"paused: {p['reason']} ({p.get('error', '')})"
    if p.get("unhealthy"):
        state += f"; UNHEALTHY: {p['unhealthy']}"
    if worker.get("stale"):
        state += f"; heartbeat {worker['beat_age_s']:.0f}s old (Redis refusing writes?)"
    return state


def _domain_rates(settings: Settings, client: redis.Redis, now_ms: int) -> list[dict[str, Any]]:
    """Requests per domain in its current window, against its configured limit."""
    limiter = RateLimiter(client, settings)
    rows = []
    for key in client.scan_iter(match="ratelimit:*", count=1000):
        name = key.decode()
        if name.endswith(":next"):
            continue
        domain = name.split(":", 1)[1]
        rate = limiter.rate_for(domain)
        used = client.zcount(name, now_ms - rate.window_ms, "+inf")
        rows.append({"domain": domain, "requests_in_window": used, "limit": rate.amount,
                     "window_s": rate.window_ms / 1000})
    return sorted(rows, key=lambda r: (-r["requests_in_window"], r["domain"]))[:50]


def _throttle_lines(snapshot: dict[str, Any]) -> list[str]:
    """Each throttled domain (common/web/throttle.py): its rate or block, and why."""
    return [f"  throttled {row['domain']}: {row['text']}"
            for row in snapshot.get("throttled", [])[:15]]


def _deferred_lines(snapshot: dict[str, Any]) -> list[str]:
    """URLs deferred in Redis (fairness, common/intake/defer.py), largest domains first."""
    deferred = snapshot.get("deferred") or {}
    if not deferred.get("total"):
        return []
    return [f"deferred: {deferred['total']:,} URLs wait in Redis for their turn "
            f"({deferred['releasing']:,} being released)"] + [
        f"  deferred {row['domain']}: {row['deferred']:,}, through in "
        f"{crawl_progress.format_duration(row['through_in_s'])}" for row in deferred["domains"]]


def render(snapshot: dict[str, Any]) -> str:
    """A short plain-text table."""
    lines = [f"{'queue':<16}{'ready':>10}{'unacked':>9}{'consumers':>11}{'in/s':>8}{'out/s':>8}"]
    for name, q in snapshot["queues"].items():
        lines.append(f"{name:<16}{q['ready']:>10}{_dash(q['unacked']):>9}{q['consumers']:>11}"
                     f"{_dash(q['publish_rate']):>8}{_dash(q['deliver_rate']):>8}")
    cache = snapshot["cache"]
    lines.append(f"seen URLs: {snapshot['seen']}   results: {snapshot['results']}   "
                 f"pages/s (1 min): {snapshot['pages_per_s_last_minute']}   "
                 f"delayed: {snapshot['delayed']}")
    lines.append(crawl_progress.progress_line(snapshot["progress"]))
    lines.append(f"dead-lettered: {snapshot['dead_lettered']} "
                 f"{snapshot['dead_lettered_by_reason'] or ''}  expired: {snapshot['expired']}  "
                 f"robots-blocked: {snapshot['robots_blocked']}  retries: {snapshot['retries']}")
    if snapshot["user_code_stopped"]:  # rules and EXTRACTOR stopped: see data_errors
        lines.append(f"user code stopped: {snapshot['user_code_stopped']}")
    if cache["hits"] or cache["misses"]:
        lines.append(f"cache: hits={cache['hits']} misses={cache['misses']} "
                     f"hit_ratio={cache['hit_ratio']:.2f}")
    lines += _pressure_lines(snapshot["pressure"])
    for row in snapshot["domains"][:10]:
        lines.append(f"  {row['domain']}: {row['requests_in_window']}/{row['limit']} "
                     f"per {row['window_s']:g}s")
    lines += _throttle_lines(snapshot)
    lines += _deferred_lines(snapshot)
    workers = snapshot["workers"]
    lines.append(f"workers alive: {len(workers)}")
    for w in workers:
        lines.append(f"  {w['id']} on {w['host']}: {worker_state(w)}, processed="
                     f"{w['processed']} in_flight={w['in_flight']} "
                     f"current={', '.join(w['current'][:3])}")
    return "\n".join(lines)


def render_rich(snapshot: dict[str, Any]) -> Group:
    """The same picture as rich tables, for ``stats.py --watch``."""
    queues = Table(title="queues", expand=True)
    for column in ("queue", "ready", "unacked", "consumers", "in/s", "out/s"):
        queues.add_column(column, justify="left" if column == "queue" else "right")
    for name, q in snapshot["queues"].items():
        queues.add_row(name, str(q["ready"]), _dash(q["unacked"]), str(q["consumers"]),
                       _dash(q["publish_rate"]), _dash(q["deliver_rate"]))
    queues.add_row("hold.* (delayed)", str(snapshot["delayed"]), "", "", "", "")
    cache = snapshot["cache"]
    summary = Table(title="fleet", expand=True, show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    progress = snapshot["progress"]
    for label, value in (
            ("progress", crawl_progress.progress_line(progress).split(": ", 1)[1]),
            ("pages/s (last minute)", snapshot["pages_per_s_last_minute"]),
            ("results", snapshot["results"]), ("seen URLs", snapshot["seen"]),
            ("cache hit ratio", _dash(cache["hit_ratio"])),
            ("dead-lettered", f"{snapshot['dead_lettered']} {snapshot['dead_lettered_by_reason']}"),
            ("robots-blocked", snapshot["robots_blocked"]), ("retries", snapshot["retries"]),
            ("expired", snapshot["expired"]), ("user code stopped", snapshot["user_code_stopped"])):
        summary.add_row(label, str(value))
    for line in _pressure_lines(snapshot["pressure"]):
        summary.add_row(*line.split(": ", 1))
    domains = Table(title="domains (requests in window / limit)", expand=True)
    domains.add_column("domain")
    domains.add_column("used / limit", justify="right")
    for row in snapshot["domains"][:15]:
        domains.add_row(row["domain"],
                        f"{row['requests_in_window']} / {row['limit']} per {row['window_s']:g}s")
    for line in _throttle_lines(snapshot):
        domains.add_row(*line.strip().split(": ", 1))
    workers = Table(title=f"workers alive: {len(snapshot['workers'])}", expand=True)
    for column in ("id", "host", "state", "processed", "in flight", "current"):
        workers.add_column(column)
    for w in snapshot["workers"]:
        workers.add_row(w["id"], w["host"], worker_state(w), str(w["processed"]),
                        str(w["in_flight"]), ", ".join(w["current"][:2]))
    return Group(queues, summary, domains, workers)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def watch(settings: Settings, connection: pika.BlockingConnection, client: redis.Redis,
          interval_s: float = 2.0) -> None:
    """Refresh the rich view until Ctrl-C."""
    from rich.live import Live

    history = RateHistory()
    with Live(render_rich(collect(settings, connection, client, history)),
              refresh_per_second=4) as live:
        while True:
            time.sleep(interval_s)
            live.update(render_rich(collect(settings, connection, client, history)))
