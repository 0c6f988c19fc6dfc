"""Settings: the environment is read once, at start-up, into one immutable object.

Every knob lives in ``KNOBS`` below with its default and a one-line description; README's
configuration table is generated from the same list (``python -m devtools.readme``). How each value is parsed:
:mod:`common.core.values`.
A bad value raises :class:`common.core.errors.ConfigError` naming the variable.

Credentials are never shown: a knob marked ``secret`` (a password) appears as ``***`` and one
marked ``url`` through :func:`common.core.redact.redact_url`, in errors, ``repr(Settings)``
(what ``python -m common.core.config`` prints) and README's table; :meth:`Settings.secrets`
is what the log formatters and error printers scrub.

Entry scripts call :func:`load_settings` once and pass the result down explicitly; nothing
else in ``common/`` reads ``os.environ``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import quote, urlsplit

from common.core import values
from common.core.errors import ConfigError
from common.core.redact import MASK, redact_url, scrub, url_secrets


@dataclass(frozen=True)
class Knob:
    """One environment variable: its name, parser, default and meaning."""

    env: str
    attr: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    secret: bool = False  #: a password: shown as *** wherever settings are shown
    url: bool = False  #: a URL that may carry a password: shown through redact_url

    def show(self, value: str | None) -> str | None:
        """How a value of this knob may be shown (None stays None)."""
        if value is None or not (self.secret or self.url):
            return value
        return MASK if self.secret else redact_url(value)

    def invalid(self, raw: str, exc: ValueError) -> ConfigError:
        """The error for a value that does not parse, naming the variable, never a secret."""
        if not (self.secret or self.url):
            return ConfigError(f"{self.env}={raw!r} is invalid: {exc}")
        shown = self.show(raw) or ""
        text = str(exc)
        for form in (raw, repr(raw)[1:-1]):  # the parsers quote the value with !r
            text = text.replace(form, shown)
        hidden = {raw} if self.secret else url_secrets(raw)
        text = scrub(text, hidden | {repr(s)[1:-1] for s in hidden})
        return ConfigError(f"{self.env}={shown!r} is invalid: {text}")


def _service_url(*schemes: str) -> Callable[[str], str]:
    """A URL with one of ``schemes`` and a host, whose port (if any) parses: else pika or
    redis-py would fail later, quoting the port text — a password, when the ``@`` is missing."""
    check = values.url_with_scheme(*schemes)

    def parse(raw: str) -> str:
        url = check(raw)
        try:
            urlsplit(url).port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError("its port is not a number from 0 to 65535") from None
        return url

    return parse


KNOBS: tuple[Knob, ...] = (
    Knob("RABBITMQ_URL", "rabbitmq_url_raw", _service_url("amqp", "amqps"), None,
         "Full AMQP URL; when set it wins over the RABBITMQ_* parts.", url=True),
    Knob("RABBITMQ_HOST", "rabbitmq_host", values.text, "localhost", "Broker host."),
    Knob("RABBITMQ_PORT", "rabbitmq_port", values.port, "5672", "Broker AMQP port."),
    Knob("RABBITMQ_USER", "rabbitmq_user", values.text, None,
         "Broker user (unset: pika's default, which RabbitMQ accepts from loopback only)."),
    Knob("RABBITMQ_PASSWORD", "rabbitmq_password", values.text, None, "Broker password.",
         secret=True),
    Knob("RABBITMQ_VHOST", "rabbitmq_vhost", values.text, "/", "Broker virtual host."),
    Knob("RABBITMQ_HEARTBEAT_S", "rabbitmq_heartbeat_s", values.non_negative_int, "30",
         "AMQP heartbeat; fetches run off the I/O thread so long fetches never miss it."),
    Knob("REDIS_URL", "redis_url_raw", _service_url("redis", "rediss", "unix"), None,
         "Full Redis URL; when set it wins over the REDIS_* parts.", url=True),
    Knob("REDIS_HOST", "redis_host", values.text, "localhost", "Redis host."),
    Knob("REDIS_PORT", "redis_port", values.port, "6379", "Redis port."),
    Knob("REDIS_DB", "redis_db", values.non_negative_int, "0", "Redis database number."),
    Knob("REDIS_PASSWORD", "redis_password", values.text, None, "Redis password (AUTH).",
         secret=True),
    Knob("CONNECT_RETRY_S", "connect_retry_s", values.non_negative_float, "30",
         "How long to retry reaching RabbitMQ/Redis (exponential backoff) before giving up."),
    Knob("WORKER_ID", "worker_id", values.text, None,
         "Worker id in logs and results (default: hostname-pid)."),
    Knob("WORKER_CONCURRENCY", "concurrency", values.positive_int, "8",
         "Parallel fetches per worker process (threads); --concurrency overrides."),
    Knob("PARSE_CONCURRENCY", "parse_concurrency", values.positive_int, "2",
         "Fetch threads that may parse and record at once; more only trade the GIL "
         "(NOTES #26)."),
    Knob("PREFETCH", "prefetch", values.non_negative_int, "0",
         "basic_qos prefetch per consumer (0: twice the concurrency)."),
    Knob("PRIORITY_AUTO_ACK", "priority_auto_ack", values.boolean, "false",
         "Consume priority_queue with auto-ack (prototype mode): faster, but a crash loses "
         "the messages in flight."),
    Knob("IDLE_EXIT_S", "idle_exit_s", values.non_negative_float, "0",
         "Exit 0 after this long with no message (0: never); --idle-exit overrides."),
    Knob("USER_AGENT", "user_agent", values.text, "scrape-fleet/0.1 (+https://example.invalid/bot)",
         "User-Agent header sent with every fetch."),
    Knob("CONNECT_TIMEOUT_S", "connect_timeout_s", values.positive_float, "5", "HTTP connect timeout."),
    Knob("READ_TIMEOUT_S", "read_timeout_s", values.positive_float, "20", "HTTP read timeout."),
    Knob("MAX_BODY_BYTES", "max_body_bytes", values.positive_int, "10485760",
         "Largest response body read (decoded bytes); longer bodies are cut and marked."),
    Knob("FETCH_ALLOW_NETWORKS", "fetch_allow_networks", values.parse_networks, "",
         "CIDRs the address guard lets fetches connect to although they are not public "
         "(e.g. 127.0.0.0/8 for local test sites). Empty: public addresses only."),
    Knob("MAX_REDIRECTS", "max_redirects", values.non_negative_int, "10",
         "Redirect hops followed (each hop guarded and capped)."),
    Knob("MAX_HEADER_BYTES", "max_header_bytes", values.positive_int, "65536",
         "Largest total size of response headers."),
    Knob("FETCH_TOTAL_TIMEOUT_S", "fetch_total_timeout_s", values.positive_float, "60",
         "Longest a whole fetch may take, redirects and a slow-drip body included."),
    Knob("ALLOWED_CONTENT_TYPES", "allowed_content_types", values.text,
         "text/html,application/xhtml+xml",
         "Content types whose body is read and parsed; others are recorded, not read."),
    Knob("RESULTS_MAXLEN", "results_maxlen", values.positive_int, "1000000",
         "Approximate MAXLEN of the `results` stream."),
    Knob("MAX_URL_LENGTH", "max_url_length", values.positive_int, "2048",
         "Longest URL accepted by the producer."),
    Knob("SEEN_BUCKETS", "seen_buckets", values.power_of_two, "16384",
         "Number of small Redis sets the seen-fingerprints are spread over (power of two)."),
    Knob("PRODUCER_BATCH", "producer_batch", values.positive_int, "1000",
         "URLs per dedupe pipeline and confirm batch in the producer."),
    Knob("ROUTING_RULES", "routing_rules", values.text, None,
         "JSON list of routing rules or @path to a JSON file (default: the prototype's rules)."),
    Knob("RATE_LIMIT", "rate_limit", values.rate, "60/minute",
         "Requests per domain shared by the whole fleet, in `limits` notation (2/second)."),
    Knob("RATE_LIMITS", "rate_limit_overrides", values.rate_overrides, "",
         "Per-domain overrides: host=rate,host=rate (a host also covers its subdomains)."),
    Knob("RATE_LIMIT_GUARD", "rate_limit_guard", values.fraction, "0.02",
         "Extra fraction of the window kept free, so network jitter cannot push two "
         "requests into one server-side window."),
    Knob("ROBOTS_ENABLED", "robots_enabled", values.boolean, "true", "Obey robots.txt."),
    Knob("ROBOTS_USER_AGENT", "robots_user_agent", values.text, "scrape-fleet",
         "Product token matched against robots.txt User-agent lines."),
    Knob("ROBOTS_TTL_S", "robots_ttl_s", values.positive_int, "86400",
         "How long a fetched robots.txt is cached in Redis."),
    Knob("CACHE_TTL_S", "cache_ttl_s", values.non_negative_int, "60",
         "Response cache TTL (content:{url}); 0 disables the cache."),
    Knob("CACHE_MAX_BYTES", "cache_max_bytes", values.positive_int, "1048576",
         "Largest compressed response kept in the cache."),
    Knob("MAX_RETRIES", "max_retries", values.non_negative_int, "3",
         "Retries of a transient failure (timeout, connection, 5xx, 429) before the DLQ."),
    Knob("RETRY_BASE_S", "retry_base_s", values.positive_float, "2",
         "First retry delay; doubles each attempt (half of it fixed, half random: equal jitter)."),
    Knob("RETRY_MAX_S", "retry_max_s", values.positive_float, "300",
         "Longest backoff delay (Retry-After may ask for more, up to RETRY_AFTER_MAX_S)."),
    Knob("RETRY_AFTER_MAX_S", "retry_after_max_s", values.positive_float, "3600",
         "Longest Retry-After honoured; longer requests are capped."),
    Knob("FAILURES_TTL_S", "failures_ttl_s", values.positive_int, "86400",
         "Expiry of the failures:{url} retry counters."),
    Knob("CRAWL_ENABLED", "crawl_enabled", values.boolean, "false",
         "Crawl mode: workers enqueue the links they extract (through the producer path)."),
    Knob("CRAWL_MAX_DEPTH", "crawl_max_depth", values.non_negative_int, "2",
         "Links are followed while the new depth stays at or below this (seeds are depth 0)."),
    Knob("CRAWL_ALLOWED_DOMAINS", "crawl_allowed_domains", values.text, "",
         "Comma-separated domains links may go to (and their subdomains); empty: the "
         "page's own host only."),
    Knob("CRAWL_MAX_PAGES_PER_DOMAIN", "crawl_max_pages", values.positive_int, "10000",
         "Pages crawl mode may enqueue per domain (counted in Redis, fleet-wide)."),
    Knob("METRICS_PORT", "metrics_port", values.non_negative_int, "0",
         "Port of the worker's Prometheus /metrics endpoint (0: off; compose sets 9100)."),
    Knob("HEARTBEAT_INTERVAL_S", "heartbeat_interval_s", values.positive_float, "5",
         "How often a worker refreshes its workers:{id} key (TTL: 3 intervals)."),
    Knob("RABBITMQ_MANAGEMENT_URL", "rabbitmq_management_url", _service_url("http", "https"),
         None, "Management API for the status view's unacked counts and rates "
         "(default: http://RABBITMQ_HOST:15672 with the AMQP credentials; optional).", url=True),
    Knob("LOG_LEVEL", "log_level", values.log_level, "INFO", "Logging level."),
    Knob("LOG_FORMAT", "log_format", values.log_format, "text",
         "text, or json for one JSON object a line."),
)


@dataclass(frozen=True, repr=False)
class Settings:
    """Typed, immutable settings. Build with :func:`load_settings`."""

    rabbitmq_url_raw: str | None = None
    rabbitmq_host: str = "localhost"
    rabbitmq_port: int = 5672
    rabbitmq_user: str | None = None
    rabbitmq_password: str | None = None
    rabbitmq_vhost: str = "/"
    rabbitmq_heartbeat_s: int = 30
    redis_url_raw: str | None = None
    redis_host: str = "localhost"
    redis_port: int = 6379
    redis_db: int = 0
    redis_password: str | None = None
    connect_retry_s: float = 30.0
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    concurrency: int = 8
    parse_concurrency: int = 2
    prefetch: int = 0
    priority_auto_ack: bool = False
    idle_exit_s: float = 0.0
    user_agent: str = "scrape-fleet/0.1 (+https://example.invalid/bot)"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 20.0
    max_body_bytes: int = 10 * 1024 * 1024
    fetch_allow_networks: tuple[Any, ...] = ()
    max_redirects: int = 10
    max_header_bytes: int = 65536
    fetch_total_timeout_s: float = 60.0
    allowed_content_types: str = "text/html,application/xhtml+xml"
    results_maxlen: int = 1_000_000
    max_url_length: int = 2048
    seen_buckets: int = 16384
    producer_batch: int = 1000
    routing_rules: str | None = None
    rate_limit: tuple[int, int] = (60, 60_000)
    rate_limit_overrides: tuple[tuple[str, tuple[int, int]], ...] = ()
    rate_limit_guard: float = 0.02
    robots_enabled: bool = True
    robots_user_agent: str = "scrape-fleet"
    robots_ttl_s: int = 86400
    cache_ttl_s: int = 60
    cache_max_bytes: int = 1024 * 1024
    max_retries: int = 3
    retry_base_s: float = 2.0
    retry_max_s: float = 300.0
    retry_after_max_s: float = 3600.0
    failures_ttl_s: int = 86400
    crawl_enabled: bool = False
    crawl_max_depth: int = 2
    crawl_allowed_domains: str = ""
    crawl_max_pages: int = 10000
    metrics_port: int = 0
    heartbeat_interval_s: float = 5.0
    rabbitmq_management_url: str | None = None
    log_level: str = "INFO"
    log_format: str = "text"

    @property
    def rabbitmq_url(self) -> str:
        """The AMQP URL, from RABBITMQ_URL or built from the parts."""
        if self.rabbitmq_url_raw:
            return self.rabbitmq_url_raw
        auth = ""
        if self.rabbitmq_user is not None:
            auth = quote(self.rabbitmq_user, safe="")
            if self.rabbitmq_password is not None:
                auth += ":" + quote(self.rabbitmq_password, safe="")
            auth += "@"
        vhost = quote(self.rabbitmq_vhost, safe="")
        return f"amqp://{auth}{self.rabbitmq_host}:{self.rabbitmq_port}/{vhost}"

    @property
    def redis_url(self) -> str:
        """The Redis URL, from REDIS_URL or built from the parts."""
        if self.redis_url_raw:
            return self.redis_url_raw
        auth = f":{quote(self.redis_password, safe='')}@" if self.redis_password else ""
        return f"redis://{auth}{self.redis_host}:{self.redis_port}/{self.redis_db}"

    def __repr__(self) -> str:
        """Every field, secrets as ``***`` and URLs redacted: safe to log or print."""
        shown = {knob.attr: knob for knob in KNOBS if knob.secret or knob.url}
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in shown:
                value = shown[f.name].show(value)
            parts.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(parts)})"

    def secrets(self) -> frozenset[str]:
        """Every password these settings hold, as given, percent-encoded (the form the built
        URLs carry) and as written inside the URLs: what printers and log formatters scrub."""
        found: set[str] = set()
        for knob in KNOBS:
            value = getattr(self, knob.attr)
            if knob.secret and value:
                found.update((value, quote(value, safe="")))
            elif knob.url and value:
                found.update(url_secrets(value))
        return frozenset(found)

    @property
    def effective_prefetch(self) -> int:
        return self.prefetch or 2 * self.concurrency

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (command-line flags, tests)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read every knob from ``env`` (default: ``os.environ``) once.

    Raises:
        ConfigError: naming the first variable whose value does not parse.
    """
    source = os.environ if env is None else env
    values: dict[str, Any] = {}
    for knob in KNOBS:
        raw = source.get(knob.env)
        if raw is None or (raw == "" and knob.default is None):
            continue
        try:
            values[knob.attr] = knob.parse(raw)
        except ValueError as exc:
            raise knob.invalid(raw, exc) from None
    return Settings(**values)


if __name__ == "__main__":
    try:
        print(load_settings())
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
