"""Prometheus metrics a worker exports (prometheus_client), and its health, on METRICS_PORT.

``GET /healthz`` answers 200 ``ok`` or 503 with the reason (common/work/pressure.py: too many
Redis errors in a row); every other path serves the metrics exactly as prometheus_client's
``start_http_server`` does (its WSGI app, gzip and OpenMetrics negotiation included).

Every name here is referenced by the Grafana dashboard (monitoring/grafana/); a test checks the
dashboard uses no other metric. Labels stay low-cardinality: outcome kinds and dead-letter
reasons, never URLs; domains only on the two throttled-domain gauges, for the domains this
worker last saw throttled (at most MAX_THROTTLED_SERIES, each dropped once healthy again).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from common.store.keys import COUNTERS

if TYPE_CHECKING:
    from common.web.renderer import Renderer
    from common.work.outcome import Outcome

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

FETCHES = Counter("fleet_fetches_total", "Messages processed, by outcome and job run "
                  "(job: name/run, empty for the default job)", ["outcome", "job"],
                  registry=REGISTRY)
FETCH_SECONDS = Histogram("fleet_fetch_seconds", "HTTP fetch latency (network only)",
                          buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                          registry=REGISTRY)
FETCH_BYTES = Counter("fleet_fetch_bytes_total", "Body bytes fetched (decoded)",
                      registry=REGISTRY)
RETRIES = Counter("fleet_retries_total", "Transient failures scheduled for a retry",
                  registry=REGISTRY)
DEAD_LETTERS = Counter("fleet_dead_letters_total", "URLs sent to failed_urls, by reason",
                       ["reason"], registry=REGISTRY)
RATE_LIMIT_DELAYS = Counter("fleet_rate_limit_delays_total",
                            "URLs parked because their domain was at its rate limit",
                            registry=REGISTRY)
CACHE_HITS = Counter("fleet_cache_hits_total", "Responses served from the cache",
                     registry=REGISTRY)
CACHE_MISSES = Counter("fleet_cache_misses_total", "Fetches that missed the cache",
                       registry=REGISTRY)
IN_FLIGHT = Gauge("fleet_in_flight", "Deliveries received and not yet settled",
                  registry=REGISTRY)
PAUSED = Gauge("fleet_worker_paused", "1 while the worker takes no deliveries, by reason",
               ["reason"], registry=REGISTRY)
HEALTHY = Gauge("fleet_worker_healthy", "0 while /healthz answers 503 (Redis errors in a row)",
                registry=REGISTRY)
REDIS_USED_MEMORY = Gauge("fleet_redis_used_memory_bytes", "Redis used_memory at the last check",
                          registry=REGISTRY)
REDIS_MAXMEMORY = Gauge("fleet_redis_maxmemory_bytes", "Redis maxmemory (0: no limit)",
                        registry=REGISTRY)
RESULTS_BACKLOG = Gauge("fleet_results_backlog", "Stream entries the most behind sink has not "
                        "exported (lag + pending)", registry=REGISTRY)
REDIS_REFUSALS = Counter("fleet_redis_refusals_total", "Deliveries returned to the broker "
                         "because Redis answered with an error", registry=REGISTRY)
THROTTLED_RATE = Gauge("fleet_throttled_domain_rate_ratio", "A throttled domain's rate as a "
                       "fraction of its configured rate (0: blocked), as this worker last saw it",
                       ["domain", "reason"], registry=REGISTRY)
THROTTLED_SINCE = Gauge("fleet_throttled_domain_since_seconds", "When the domain's throttling "
                        "began (Unix time)", ["domain", "reason"], registry=REGISTRY)
RENDER_BROWSERS = Gauge("fleet_render_browsers", "A render worker's running browsers "
                        "(Chromium processes groups) at the last heartbeat", registry=REGISTRY)
RENDER_MEMORY = Gauge("fleet_render_memory_bytes", "PSS of a render worker's browsers (all "
                      "their processes) at the last heartbeat", registry=REGISTRY)
RENDER_LAUNCHES = Gauge("fleet_render_launches", "Browsers its running browser threads have "
                        "launched (a recycled or dead browser is replaced)", registry=REGISTRY)
USER_CODE_STOPPED = Counter("fleet_user_code_stopped_total", "Pages whose user code was "
                            "stopped: regex_timeouts, extractor_timeouts, extractor_crashes",
                            ["kind"], registry=REGISTRY)
ASSETS = Counter("fleet_assets_total", "Assets the download workers recorded, by whether the "
                 "store already had their bytes (stored: new, existing)", ["stored"],
                 registry=REGISTRY)
ASSET_BYTES = Counter("fleet_asset_bytes_total", "Asset bytes the download workers downloaded",
                      registry=REGISTRY)
HEALTHY.set(1)

#: Every metric family the workers export (the dashboard test reads this).
EXPORTED = ("fleet_fetches_total", "fleet_fetch_seconds", "fleet_fetch_bytes_total",
            "fleet_retries_total", "fleet_dead_letters_total", "fleet_rate_limit_delays_total",
            "fleet_cache_hits_total", "fleet_cache_misses_total", "fleet_in_flight",
            "fleet_worker_paused", "fleet_worker_healthy", "fleet_redis_used_memory_bytes",
            "fleet_redis_maxmemory_bytes", "fleet_results_backlog", "fleet_redis_refusals_total",
            "fleet_throttled_domain_rate_ratio", "fleet_throttled_domain_since_seconds",
            "fleet_user_code_stopped_total", "fleet_render_browsers", "fleet_render_memory_bytes",
            "fleet_render_launches", "fleet_assets_total", "fleet_asset_bytes_total")

#: Most throttled domains one worker exports at a time (the rest: stats.py lists them all).
MAX_THROTTLED_SERIES = 100
_shown: dict[str, str] = {}  # domain -> the reason label its series carry
_shown_lock = threading.Lock()


def count_rate_limited(client: Any) -> None:
    """A URL parked for its rate-limit turn: the fleet's counter (Redis, the status view) and
    this worker's metric."""
    client.hincrby(COUNTERS, "rate_limited", 1)
    RATE_LIMIT_DELAYS.inc()


def show_throttle(domain: str, state: Any) -> None:
    """Export ``domain``'s throttle as the admit call returned it (a ThrottleState, or None):
    its rate (0 while blocked) and since when, labelled with why; drop it once healthy."""
    if (state is None or not state.active) and domain not in _shown:
        return  # the hot path: a healthy domain, not exported
    with _shown_lock:
        reason = _shown.pop(domain, None)
        if reason is not None:
            THROTTLED_RATE.remove(domain, reason)
            THROTTLED_SINCE.remove(domain, reason)
        if state is None or not state.active or len(_shown) >= MAX_THROTTLED_SERIES:
            return
        # "http_503, Retry-After 30 s" -> http_503, "slow: 2.10 s, median ..." -> slow
        reason = _shown[domain] = state.reason.split(":")[0].split(",")[0] or "unknown"
        THROTTLED_RATE.labels(domain, reason).set(0 if state.blocked_ms else state.rate)
        THROTTLED_SINCE.labels(domain, reason).set(state.since_ms / 1000)


Health = Callable[[], tuple[bool, str]]


def serve(port: int, health: Health = lambda: (True, "ok"),
          address: str = "127.0.0.1") -> WSGIServer | None:
    """Serve /metrics and /healthz on ``address:port`` in a daemon thread (0: off); returns
    the server (for :func:`stop`). ``address`` is METRICS_HOST: loopback unless told, since
    the metrics' labels name the domains being crawled."""
    if not port:
        return None
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics_app(environ, start_response)
        healthy, why = health()
        body = b"ok\n" if healthy else f"unhealthy: {why}\n".encode()
        start_response("200 OK" if healthy else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body)))])
        return [body]

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                            flags=socket.AI_PASSIVE)[0][0]

    server = make_server(address, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    logger.info("metrics on http://%s:%d/metrics, health on /healthz", address, port)
    return server


def stop(server: WSGIServer | None) -> None:
    """Stop a server :func:`serve` started (None: nothing to stop)."""
    if server is not None:
        server.shutdown()
        server.server_close()


class _QuietHandler(WSGIRequestHandler):
    """No log line per request (Prometheus scrapes every 5 s)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


#: The outcome lines keep the worker's logger name (what a log filter names).
OUTCOME_LOG = logging.getLogger("common.work.worker")
#: Outcomes logged at DEBUG: parks, and a paused or cancelled job's pages (50,000 lines each).
QUIET_OUTCOMES = ("delay", "paused", "cancelled")


def count_outcome(queue: str, outcome: Outcome) -> None:
    """One settled delivery: its metrics (by outcome and job run) and its log line (with its
    job run, if any)."""
    FETCHES.labels(outcome.kind, outcome.job).inc()
    if outcome.kind == "dead_letter" and outcome.publishes:
        DEAD_LETTERS.labels((outcome.publishes[0].headers or {}).get("reason", "unknown")).inc()
    OUTCOME_LOG.log(logging.DEBUG if outcome.kind in QUIET_OUTCOMES else logging.INFO,
                    "%s %s -> %s %s%s", queue, outcome.url, outcome.kind, outcome.detail,
                    f" [job {outcome.job}]" if outcome.job else "")


def render_pool(renderer: Renderer | None) -> dict[str, Any] | None:
    """A render worker's pool for its heartbeat (None: not a render worker), its gauges set."""
    if renderer is None:
        return None
    pool = renderer.snapshot()
    RENDER_BROWSERS.set(pool["browsers"])
    RENDER_MEMORY.set(pool["memory_mb"] * 2**20)
    RENDER_LAUNCHES.set(pool["launches"])
    return pool
