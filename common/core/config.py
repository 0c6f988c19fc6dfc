"""Settings: the environment is read once, at start-up, into one immutable object.

Every knob lives in ``KNOBS`` below with its default and a one-line description; README's
configuration table is generated from the same list (``python -m devtools.readme``). How each value is parsed:
:mod:`common.core.values`.
A bad value raises :class:`common.core.errors.ConfigError` naming the variable.

Credentials are never shown: a knob marked ``secret`` (a password) appears as ``***`` and one
marked ``url`` through :func:`common.core.redact.redact_url`, in errors, ``repr(Settings)``
(what ``python -m common.core.config`` prints) and README's table; :meth:`Settings.secrets`
is what the log formatters and error printers scrub.

An empty variable counts as unset. A password, or a URL that may carry one, can come from a
file instead: ``RABBITMQ_PASSWORD_FILE=/run/secrets/...`` (:func:`raw_value`).

Entry scripts call :func:`load_settings` once and pass the result down explicitly; nothing
else in ``common/`` reads ``os.environ``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import quote

from common.core.errors import ConfigError
from common.core.knobs import KNOBS, Knob, url_list_secrets

__all__ = ["KNOBS", "Knob", "Settings", "load_settings"]


@dataclass(frozen=True, repr=False)
class Settings:
    """Typed, immutable settings. Build with :func:`load_settings`."""

    rabbitmq_url_raw: str | None = None
    rabbitmq_urls_raw: str | None = None
    queue_type: str = "classic"
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
    redis_sentinels: tuple[tuple[str, int], ...] = ()
    redis_sentinel_master: str = "mymaster"
    redis_sentinel_password: str | None = None
    redis_min_replicas: int = 0
    redis_wait_timeout_ms: int = 1000
    redis_wait_max_s: float = 300.0
    connect_retry_s: float = 30.0
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    concurrency: int = 8
    fetch_loops: int = 1
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
    results_maxlen: int = 100_000
    max_record_bytes: int = 65536
    record_max_links: int = 1000
    max_page_tags: int = 100000
    poison_deliveries: int = 3
    stuck_page_s: float = 30.0
    extract_rules: str = ""
    extractor: str = ""
    handlers: str = ""
    extractor_timeout_s: float = 2.0
    extractor_max_memory_bytes: int = 512 * 1024 * 1024
    rules_regex_timeout_s: float = 1.0
    archive: str = "none"
    archive_dir: str = "archive"
    archive_max_bytes: int = 1 << 30
    archive_fsync: bool = False
    redis_memory_high: float = 0.9
    redis_memory_low: float = 0.8
    results_backlog_high: int = 80_000
    results_backlog_low: int = 40_000
    pressure_check_s: float = 1.0
    sink: str = ""
    sink_batch: int = 500
    sink_dir: str = "results"
    sink_rotate_bytes: int = 128 * 1024 * 1024
    sink_rotate_s: float = 3600.0
    postgres_url: str | None = None
    postgres_table: str = "crawl_results"
    schedule_interval_s: int = 86400
    schedule_min_interval_s: int = 3600
    schedule_max_interval_s: int = 14 * 86400
    schedule_growth: float = 0.5
    schedule_shrink: float = 0.5
    schedule_batch: int = 500
    schedule_max_queued: int = 10_000
    schedule_lease_s: float = 10.0
    max_url_length: int = 2048
    seen_buckets: int = 16384
    producer_batch: int = 1000
    defer_lead_s: float = 10.0
    defer_batch: int = 500
    defer_lease_s: float = 60.0
    routing_rules: str | None = None
    rate_limit: tuple[int, int] = (60, 60_000)
    rate_limit_overrides: tuple[tuple[str, tuple[int, int]], ...] = ()
    rate_limit_guard: float = 0.02
    robots_enabled: bool = True
    robots_user_agent: str = "scrape-fleet"
    robots_ttl_s: int = 86400
    robots_max_crawl_delay_s: float = 30.0
    cache_ttl_s: int = 60
    cache_max_bytes: int = 1024 * 1024
    max_retries: int = 3
    retry_base_s: float = 2.0
    retry_max_s: float = 300.0
    retry_after_max_s: float = 3600.0
    throttle_block_start_s: float = 60.0
    throttle_block_factor: float = 2.0
    throttle_block_max_s: float = 86400.0
    throttle_forgive_s: float = 1800.0
    throttle_jitter: float = 0.1
    throttle_decrease: float = 0.5
    throttle_increase: float = 0.05
    throttle_rate_floor: float = 0.05
    throttle_slow_factor: float = 4.0
    throttle_slow_min_s: float = 1.0
    max_wait_s: float = 86400.0
    failures_ttl_s: int = 86400
    crawl_enabled: bool = False
    crawl_max_depth: int = 2
    crawl_allowed_domains: str = ""
    crawl_max_pages: int = 10000
    crawl_nofollow: bool = True
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    heartbeat_interval_s: float = 5.0
    rabbitmq_management_url: str | None = None
    log_level: str = "INFO"
    log_format: str = "text"

    @property
    def rabbitmq_urls(self) -> tuple[str, ...]:
        """Every broker address: RABBITMQ_URLS, else RABBITMQ_URL (either may be a
        comma-separated list), else the one URL built from the parts."""
        listed = self.rabbitmq_urls_raw or self.rabbitmq_url_raw
        if listed:
            return tuple(listed.split(","))
        return (self.rabbitmq_url,)

    @property
    def rabbitmq_url(self) -> str:
        """The (first) AMQP URL, from RABBITMQ_URLS/RABBITMQ_URL or built from the parts."""
        listed = self.rabbitmq_urls_raw or self.rabbitmq_url_raw
        if listed:
            return listed.split(",")[0]
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
                found.update(url_list_secrets(value))
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
        raw = raw_value(knob, source)
        if raw is None:
            continue
        try:
            values[knob.attr] = knob.parse(raw)
        except ValueError as exc:
            raise knob.invalid(raw, exc) from None
        refuse_placeholder(knob, values[knob.attr])
    return Settings(**values)


def raw_value(knob: Knob, source: Mapping[str, str]) -> str | None:
    """The text of ``knob`` in ``source``: its variable, else the file its ``*_FILE`` variable
    names (a password or a URL carrying one: Swarm and Compose secrets), else None.

    An empty value is no value (the knob's default applies): Compose passes every setting to
    every service as ``NAME: ${NAME:-}``, empty where .env does not set it. A file's content
    loses one trailing newline (``echo pw > file``), nothing else.

    Raises:
        ConfigError: both the variable and its ``*_FILE`` are set, or the file cannot be read
            or is empty; naming the variable and the path, never the content.
    """
    raw = source.get(knob.env) or None
    file_env = knob.file_env
    path = source.get(file_env) if file_env else None
    if not path:
        return raw
    if raw is not None:
        raise ConfigError(f"{knob.env} and {file_env} are both set: keep one")
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{file_env}={path!r}: cannot read it "
                          f"({type(exc).__name__}: {exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file_env}={path!r}: not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"{file_env}={path!r}: the file is empty")
    return text


#: How every password in .env.example starts: one still there was never set.
PLACEHOLDER_PREFIX = "change-me"


def refuse_placeholder(knob: Knob, value: Any) -> None:
    """Refuse a password (a ``secret`` knob's value, or one inside a ``url`` knob's URLs) that
    is still a ``change-me...`` placeholder of .env.example: compose would otherwise start a
    broker and Redis that anyone who read the repository can log into.

    Raises:
        ConfigError: naming the variable and what to set, never the value.
    """
    if not isinstance(value, str) or not (knob.secret or knob.url):
        return
    passwords = {value} if knob.secret else url_list_secrets(value)
    if any(p.strip().lower().startswith(PLACEHOLDER_PREFIX) for p in passwords):
        raise ConfigError(
            f"{knob.env} holds a placeholder password ('{PLACEHOLDER_PREFIX}...' from "
            ".env.example): set a real one in .env (or the environment), e.g. the output of "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(24))'` (compose's "
            "RabbitMQ keeps the password it first started with: `docker compose down -v`, "
            "or `rabbitmqctl change_password`)")


if __name__ == "__main__":
    try:
        print(load_settings())
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
