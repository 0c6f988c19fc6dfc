"""Settings groups of what comes out and of running the fleet: result sinks, recrawls, and
operations (metrics, heartbeats, the management API, logs).

Each field is declared once with :func:`~common.core.settings.declare.setting`: its variable,
parser, default text (parsed: the field's default) and meaning (the configuration reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.core import values
from common.core.settings.declare import SettingsGroup, setting


@dataclass(frozen=True, repr=False)
class SinkSettings(SettingsGroup):
    """Result sinks: which one runs, and the files and postgres sinks' settings."""

    sink: str = setting(
        "SINK", values.text, "",
        "What `scrape-fleet sink` runs when no kind is named: `files`, `postgres`, a name "
        "registered under the `scrape_fleet.sinks` entry point, or `package.module:Class`. "
        "Empty: `files`.")
    sink_batch: int = setting(
        "SINK_BATCH", values.positive_int, "500",
        "Stream entries a sink reads, writes durably and acknowledges at a time.")
    sink_dir: str = setting(
        "SINK_DIR", values.text, "results",
        "Directory of the files sink (gzip JSON Lines parts).")
    sink_rotate_bytes: int = setting(
        "SINK_ROTATE_BYTES", values.positive_int, "134217728",
        "A files-sink part is closed once its compressed size passes this...")
    sink_rotate_s: float = setting(
        "SINK_ROTATE_S", values.positive_float, "3600",
        "...or once it has been open this long.")
    postgres_url: str | None = setting(
        "POSTGRES_URL", values.url_with_scheme("postgresql", "postgres"), None,
        "PostgreSQL for the postgres sink (postgresql://user:password@host:5432/db).", url=True)
    postgres_table: str = setting(
        "POSTGRES_TABLE", values.identifier, "crawl_results",
        "Table the postgres sink upserts into (one row per URL).")


@dataclass(frozen=True, repr=False)
class RecrawlSettings(SettingsGroup):
    """Recrawls: the scheduler's intervals, batches and lease."""

    schedule_interval_s: int = setting(
        "SCHEDULE_INTERVAL_S", values.positive_int, "86400",
        "Recrawl interval a scheduled URL starts with when neither `scrape-fleet schedule "
        "add --interval` nor its sitemap (changefreq, lastmod) says otherwise.")
    schedule_min_interval_s: int = setting(
        "SCHEDULE_MIN_INTERVAL_S", values.positive_int, "3600",
        "Shortest recrawl interval: a page that changes at every visit converges to it.")
    schedule_max_interval_s: int = setting(
        "SCHEDULE_MAX_INTERVAL_S", values.positive_int, "1209600",
        "Longest recrawl interval: a page that never changes converges to it (14 days).")
    schedule_growth: float = setting(
        "SCHEDULE_GROWTH", values.fraction, "0.5",
        "Unchanged (same content_hash, or 304): interval × (1 + this), up to the max.")
    schedule_shrink: float = setting(
        "SCHEDULE_SHRINK", values.fraction, "0.5",
        "Changed: interval × (1 - this) + min × this, down to the min.")
    schedule_batch: int = setting(
        "SCHEDULE_BATCH", values.positive_int, "500",
        "Due URLs the scheduler takes, publishes and reschedules at a time.")
    schedule_max_queued: int = setting(
        "SCHEDULE_MAX_QUEUED", values.positive_int, "10000",
        "The scheduler publishes no batch while the work queues hold this many messages: due "
        "URLs wait in the schedule, not in queues whose TTL would expire them.")
    schedule_lease_s: float = setting(
        "SCHEDULE_LEASE_S", values.positive_float, "10",
        "The active scheduler's lease; a killed one is replaced within about 1.25 × this.")


@dataclass(frozen=True, repr=False)
class JobSettings(SettingsGroup):
    """Jobs: the job runner (in `scrape-fleet schedule run`) and its webhooks."""

    job_tick_s: float = setting(
        "JOB_TICK_S", values.positive_float, "1",
        "How often the job runner starts due runs, checks running jobs for their end and "
        "limits, and sends due webhooks.")
    job_quiet_s: float = setting(
        "JOB_QUIET_S", values.positive_float, "3",
        "A run is finished once nothing is left and its counters and the workers' in-flight "
        "pages showed none of it for this long.")
    job_webhook_hosts: str = setting(
        "JOB_WEBHOOK_HOSTS", values.text, "",
        "Comma-separated hosts a job's webhooks may post to (and their subdomains); a job "
        "naming another is refused at submission. Empty: no webhooks.")
    job_webhook_attempts: int = setting(
        "JOB_WEBHOOK_ATTEMPTS", values.positive_int, "6",
        "Tries of one webhook POST (backoff 2, 4, 8 … s) before it is dropped and logged.")
    job_webhook_timeout_s: float = setting(
        "JOB_WEBHOOK_TIMEOUT_S", values.positive_float, "10",
        "Time one webhook POST may take.")


@dataclass(frozen=True, repr=False)
class ApiSettings(SettingsGroup):
    """The control plane: the API service's address, logins and cross-origin calls."""

    api_host: str = setting(
        "API_HOST", values.text, "127.0.0.1",
        "Address `scrape-fleet api` listens on: loopback unless told (compose publishes it on "
        "127.0.0.1:8000; Kubernetes sets 0.0.0.0 behind its Service).")
    api_port: int = setting("API_PORT", values.port, "8000", "Port of `scrape-fleet api`.")
    api_token_ttl_s: int = setting(
        "API_TOKEN_TTL_S", values.non_negative_int, "43200",
        "Lifetime of the token a UI login creates (12 h); 0: until revoked. Tokens made with "
        "`scrape-fleet api token create` never expire unless given --ttl.")
    api_login_attempts: int = setting(
        "API_LOGIN_ATTEMPTS", values.positive_int, "5",
        "Failed logins a user name, or a client address, may make before logins from it are "
        "refused (429) for API_LOGIN_BLOCK_S.")
    api_login_block_s: int = setting(
        "API_LOGIN_BLOCK_S", values.positive_int, "900",
        "How long failed logins are counted and a blocked one stays blocked.")
    api_cors_origins: str = setting(
        "API_CORS_ORIGINS", values.text, "",
        "Comma-separated origins allowed to call the API from a browser page of theirs "
        "(CORS); empty: none (the UI is served by the API itself and needs none).")


@dataclass(frozen=True, repr=False)
class OpsSettings(SettingsGroup):
    """Operating the fleet: metrics, heartbeats, the management API, logs."""

    metrics_port: int = setting(
        "METRICS_PORT", values.non_negative_int, "0",
        "Port of the worker's Prometheus /metrics endpoint (0: off; compose sets 9100).")
    metrics_host: str = setting(
        "METRICS_HOST", values.text, "127.0.0.1",
        "Address METRICS_PORT listens on: loopback unless told (its labels name crawled "
        "domains); compose and Kubernetes set 0.0.0.0 for Prometheus and the probes.")
    heartbeat_interval_s: float = setting(
        "HEARTBEAT_INTERVAL_S", values.positive_float, "5",
        "How often a worker refreshes its workers:{id} key (TTL: 3 intervals).")
    rabbitmq_management_url: str | None = setting(
        "RABBITMQ_MANAGEMENT_URL", values.url_list("http", "https"), None,
        "Management API for the status view's unacked counts and rates, or several "
        "comma-separated (a cluster: the first that answers) (default: port 15672 of each "
        "broker address, with the AMQP credentials; optional).", url=True)
    log_level: str = setting("LOG_LEVEL", values.log_level, "INFO", "Logging level.")
    log_format: str = setting(
        "LOG_FORMAT", values.log_format, "text",
        "text, or json for one JSON object a line.")
