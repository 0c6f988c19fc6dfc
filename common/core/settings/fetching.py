"""Settings groups of a URL's way through the fleet: the worker process, one fetch, the shared
state's shape, taking URLs in, politeness, the response cache, and waiting (retries, throttle).

Each field is declared once with :func:`~common.core.settings.declare.setting`: its variable,
parser, default text (parsed: the field's default) and meaning (the configuration reference).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from common.core import values
from common.core.settings.declare import SettingsGroup, setting


def host_pid() -> str:
    """WORKER_ID's default: ``hostname-pid``, unique per process."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, repr=False)
class WorkerSettings(SettingsGroup):
    """One worker process: its id, how many fetches it runs and how it consumes."""

    worker_id: str = setting(
        "WORKER_ID", values.text, None,
        "Worker id in logs and results (default: hostname-pid).", factory=host_pid)
    concurrency: int = setting(
        "WORKER_CONCURRENCY", values.positive_int, "8",
        "Parallel fetches per worker process; --concurrency overrides.")
    fetch_loops: int = setting(
        "FETCH_LOOPS", values.positive_int, "1",
        "Threads driving the worker's fetches (libcurl multi, a greenlet per fetch), each "
        "with its share of WORKER_CONCURRENCY; one costs the least CPU per page (NOTES #26).")
    prefetch: int = setting(
        "PREFETCH", values.non_negative_int, "0",
        "basic_qos prefetch per consumer (0: twice the concurrency).")
    priority_auto_ack: bool = setting(
        "PRIORITY_AUTO_ACK", values.boolean, "false",
        "Consume priority_queue with auto-ack (prototype mode): faster, but a crash loses "
        "the messages in flight.")
    idle_exit_s: float = setting(
        "IDLE_EXIT_S", values.non_negative_float, "0",
        "Exit 0 after this long with no message (0: never), once no retry or wait in a hold "
        "queue shorter than that is still to come back and no URL deferred in Redis is due "
        "within it; --idle-exit overrides.")

    @property
    def effective_prefetch(self) -> int:
        """PREFETCH, or twice the concurrency when it is 0."""
        return self.prefetch or 2 * self.concurrency


@dataclass(frozen=True, repr=False)
class FetchSettings(SettingsGroup):
    """One HTTP fetch: what is sent, where it may connect, and its limits."""

    user_agent: str = setting(
        "USER_AGENT", values.text, "scrape-fleet/0.1 (+https://example.invalid/bot)",
        "User-Agent header sent with every fetch.")
    connect_timeout_s: float = setting(
        "CONNECT_TIMEOUT_S", values.positive_float, "5",
        "HTTP connect timeout.")
    read_timeout_s: float = setting(
        "READ_TIMEOUT_S", values.positive_float, "20",
        "HTTP read timeout.")
    max_body_bytes: int = setting(
        "MAX_BODY_BYTES", values.positive_int, "10485760",
        "Largest response body read (decoded bytes); longer bodies are cut and marked.")
    fetch_allow_networks: tuple[values.IPNetwork, ...] = setting(
        "FETCH_ALLOW_NETWORKS", values.parse_networks, "",
        "CIDRs the address guard lets fetches connect to although they are not public "
        "(e.g. 127.0.0.0/8 for local test sites). Empty: public addresses only.")
    max_redirects: int = setting(
        "MAX_REDIRECTS", values.non_negative_int, "10",
        "Redirect hops in all: followed within the origin, handed off as new URLs beyond it.")
    max_header_bytes: int = setting(
        "MAX_HEADER_BYTES", values.positive_int, "65536",
        "Largest total size of response headers.")
    fetch_total_timeout_s: float = setting(
        "FETCH_TOTAL_TIMEOUT_S", values.positive_float, "60",
        "Longest a whole fetch may take, redirects and a slow-drip body included.")
    allowed_content_types: str = setting(
        "ALLOWED_CONTENT_TYPES", values.text, "text/html,application/xhtml+xml",
        "Content types whose body is read and parsed; others are recorded, not read.")


@dataclass(frozen=True, repr=False)
class StateSettings(SettingsGroup):
    """The shape of the fleet's shared state, which every process must agree on."""

    results_maxlen: int = setting(
        "RESULTS_MAXLEN", values.positive_int, "100000",
        "Approximate MAXLEN of the `results` stream.")
    max_url_length: int = setting(
        "MAX_URL_LENGTH", values.positive_int, "2048",
        "Longest URL accepted by the producer.")
    seen_buckets: int = setting(
        "SEEN_BUCKETS", values.power_of_two, "16384",
        "Number of small Redis sets the seen-fingerprints are spread over (power of two).")


@dataclass(frozen=True, repr=False)
class IntakeSettings(SettingsGroup):
    """Taking URLs in: the producer's batches, deferral for fairness, and routing."""

    producer_batch: int = setting(
        "PRODUCER_BATCH", values.positive_int, "1000",
        "URLs per dedupe pipeline and confirm batch in the producer.")
    defer_lead_s: float = setting(
        "DEFER_LEAD_S", values.non_negative_float, "10",
        "Fairness across domains: the producer publishes a domain's URLs at most this long "
        "before their turn at the domain's rate; the rest wait in Redis (deferred) and the "
        "workers release them on time, so a huge domain cannot bury the others (0: off).")
    defer_batch: int = setting(
        "DEFER_BATCH", values.positive_int, "500",
        "Deferred URLs a worker's releaser moves into RabbitMQ per claim.")
    defer_lease_s: float = setting(
        "DEFER_LEASE_S", values.positive_float, "60",
        "How long a releaser owns a claimed batch of deferred URLs; a batch whose releaser "
        "died (kill -9) is claimed and published again after it.")
    routing_rules: str | None = setting(
        "ROUTING_RULES", values.text, None,
        "JSON list of routing rules or @path to a JSON file (default: the prototype's rules).")


@dataclass(frozen=True, repr=False)
class PolitenessSettings(SettingsGroup):
    """Politeness: each domain's rate, shared by the fleet, and robots.txt."""

    rate_limit: tuple[int, int] = setting(
        "RATE_LIMIT", values.rate, "60/minute",
        "Requests per domain shared by the whole fleet, in `limits` notation (2/second).")
    rate_limit_overrides: tuple[tuple[str, tuple[int, int]], ...] = setting(
        "RATE_LIMITS", values.rate_overrides, "",
        "Per-domain overrides: host=rate,host=rate (a host also covers its subdomains).")
    rate_limit_guard: float = setting(
        "RATE_LIMIT_GUARD", values.fraction, "0.02",
        "Extra fraction of the window kept free, so network jitter cannot push two "
        "requests into one server-side window.")
    robots_enabled: bool = setting("ROBOTS_ENABLED", values.boolean, "true", "Obey robots.txt.")
    robots_user_agent: str = setting(
        "ROBOTS_USER_AGENT", values.text, "scrape-fleet",
        "Product token matched against robots.txt User-agent lines.")
    robots_ttl_s: int = setting(
        "ROBOTS_TTL_S", values.positive_int, "86400",
        "How long a fetched robots.txt is cached in Redis.")
    robots_max_crawl_delay_s: float = setting(
        "ROBOTS_MAX_CRAWL_DELAY_S", values.positive_float, "30",
        "Longest robots.txt Crawl-delay honoured (Bing's range ends at 30 s; Google ignores "
        "the line); a longer one means one request per this many seconds.")


@dataclass(frozen=True, repr=False)
class CacheSettings(SettingsGroup):
    """The response cache in Redis."""

    cache_ttl_s: int = setting(
        "CACHE_TTL_S", values.non_negative_int, "60",
        "Response cache TTL (content:{url}); 0 disables the cache.")
    cache_max_bytes: int = setting(
        "CACHE_MAX_BYTES", values.positive_int, "1048576",
        "Largest compressed response kept in the cache.")


@dataclass(frozen=True, repr=False)
class BackoffSettings(SettingsGroup):
    """Waiting and giving up: a URL's retries, a domain's throttle, and how long a URL may wait."""

    max_retries: int = setting(
        "MAX_RETRIES", values.non_negative_int, "3",
        "Retries of a transient failure (timeout, connection, 5xx, 429) before the DLQ.")
    retry_base_s: float = setting(
        "RETRY_BASE_S", values.positive_float, "2",
        "First retry delay; doubles each attempt (half of it fixed, half random: equal jitter).")
    retry_max_s: float = setting(
        "RETRY_MAX_S", values.positive_float, "300",
        "Longest backoff delay (Retry-After may ask for more, up to RETRY_AFTER_MAX_S).")
    retry_after_max_s: float = setting(
        "RETRY_AFTER_MAX_S", values.positive_float, "3600",
        "Longest Retry-After honoured; longer requests are capped.")
    throttle_block_start_s: float = setting(
        "THROTTLE_BLOCK_START_S", values.positive_float, "60",
        "A 429 or 503 without Retry-After blocks its whole domain, fleet-wide, this long the "
        "first time (with Retry-After: until then)...")
    throttle_block_factor: float = setting(
        "THROTTLE_BLOCK_FACTOR", values.positive_float, "2",
        "...times this for each new incident (answers to requests sent before the block "
        "ended are the same incident)...")
    throttle_block_max_s: float = setting(
        "THROTTLE_BLOCK_MAX_S", values.positive_float, "86400",
        "...at most this long.")
    throttle_forgive_s: float = setting(
        "THROTTLE_FORGIVE_S", values.positive_float, "1800",
        "A domain with no 429, 503, timeout or slow answer for this long is forgiven: its "
        "block curve starts over and its configured rate is back.")
    throttle_jitter: float = setting(
        "THROTTLE_JITTER", values.fraction, "0.1",
        "Up to this fraction is added at random to each block from the curve, so domains "
        "blocked together do not come back together.")
    throttle_decrease: float = setting(
        "THROTTLE_DECREASE", values.fraction, "0.5",
        "A timeout or a slow answer multiplies the domain's rate by this (once per round "
        "of requests)...")
    throttle_increase: float = setting(
        "THROTTLE_INCREASE", values.fraction, "0.05",
        "...each healthy answer adds this fraction of its configured rate back, never above "
        "the configured rate...")
    throttle_rate_floor: float = setting(
        "THROTTLE_RATE_FLOOR", values.fraction, "0.05",
        "...and never below this fraction of it.")
    throttle_slow_factor: float = setting(
        "THROTTLE_SLOW_FACTOR", values.positive_float, "4",
        "An answer is slow when it took longer than this multiple of the domain's median "
        "(over the worker's last 20 answers from it)...")
    throttle_slow_min_s: float = setting(
        "THROTTLE_SLOW_MIN_S", values.non_negative_float, "1",
        "...and longer than this.")
    max_wait_s: float = setting(
        "MAX_WAIT_S", values.non_negative_float, "86400",
        "A URL whose turn (rate limit, blocked domain) would come later than this after it "
        "was first parked is dead-lettered `waited_too_long` (0: no limit).")
    failures_ttl_s: int = setting(
        "FAILURES_TTL_S", values.positive_int, "86400",
        "Expiry of the failures:{url} retry counters.")
