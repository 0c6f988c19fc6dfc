"""Prometheus metrics a worker exports (prometheus_client), on METRICS_PORT.

Every name here is referenced by the Grafana dashboard (monitoring/grafana/); a test checks the
dashboard uses no other metric. Labels stay low-cardinality: outcome kinds and dead-letter
reasons, never URLs or domains.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

FETCHES = Counter("fleet_fetches_total", "Messages processed, by outcome",
                  ["outcome"], registry=REGISTRY)
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

#: Every metric family the workers export (the dashboard test reads this).
EXPORTED = ("fleet_fetches_total", "fleet_fetch_seconds", "fleet_fetch_bytes_total",
            "fleet_retries_total", "fleet_dead_letters_total", "fleet_rate_limit_delays_total",
            "fleet_cache_hits_total", "fleet_cache_misses_total", "fleet_in_flight")


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 - inside the container
    """Serve /metrics on ``port`` (0: off)."""
    if port:
        start_http_server(port, addr=address, registry=REGISTRY)
        logger.info("metrics on http://%s:%d/metrics", address, port)
