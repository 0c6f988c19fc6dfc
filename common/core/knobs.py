"""Every setting: its environment variable, parser, default and meaning, in one table.

:data:`KNOBS` is what :func:`common.core.config.load_settings` reads and what README's
configuration table is generated from (``python -m devtools.readme``). A knob marked ``secret``
or ``url`` is never shown with its password, and may be read from a file instead
(``NAME_FILE``, :attr:`Knob.file_env`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.core import values
from common.core.errors import ConfigError
from common.core.redact import MASK, redact_url, scrub, url_secrets


def url_list_secrets(value: str) -> set[str]:
    """The passwords of a URL, or of each URL of a comma-separated list."""
    return {secret for part in {value, *value.split(",")} for secret in url_secrets(part)}


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

    @property
    def file_env(self) -> str | None:
        """``NAME_FILE`` for a password or a URL that may carry one (a file holding the value:
        a Swarm or Compose secret); None for other knobs."""
        return f"{self.env}_FILE" if self.secret or self.url else None

    def show(self, value: str | None) -> str | None:
        """How a value of this knob may be shown (None stays None)."""
        if value is None or not (self.secret or self.url):
            return value
        # A URL knob may hold a comma-separated list (RABBITMQ_URLS): each one redacted.
        return MASK if self.secret else ",".join(redact_url(part) for part in value.split(","))

    def invalid(self, raw: str, exc: ValueError) -> ConfigError:
        """The error for a value that does not parse, naming the variable, never a secret."""
        if not (self.secret or self.url):
            return ConfigError(f"{self.env}={raw!r} is invalid: {exc}")
        shown = self.show(raw) or ""
        text = str(exc)
        for form in (raw, repr(raw)[1:-1]):  # the parsers quote the value with !r
            text = text.replace(form, shown)
        hidden = {raw} if self.secret else url_list_secrets(raw)
        text = scrub(text, hidden | {repr(s)[1:-1] for s in hidden})
        return ConfigError(f"{self.env}={shown!r} is invalid: {text}")


KNOBS: tuple[Knob, ...] = (
    Knob("RABBITMQ_URL", "rabbitmq_url_raw", values.url_list("amqp", "amqps"), None,
         "Full AMQP URL (or several, comma-separated: a cluster's nodes); when set it wins "
         "over the RABBITMQ_* parts.", url=True),
    Knob("RABBITMQ_URLS", "rabbitmq_urls_raw", values.url_list("amqp", "amqps"), None,
         "AMQP URLs of a cluster's nodes, comma-separated; wins over RABBITMQ_URL. Every "
         "process connects to a live one (random order) and moves to another when it dies.",
         url=True),
    Knob("QUEUE_TYPE", "queue_type", values.choice("classic", "quorum"), "classic",
         "classic (one broker), or quorum: replicated queues for a RabbitMQ cluster, "
         "at-least-once dead-lettering, a delivery limit (NOTES #40). Decided "
         "at deployment: switching needs new queues."),
    Knob("RABBITMQ_HOST", "rabbitmq_host", values.text, "localhost", "Broker host."),
    Knob("RABBITMQ_PORT", "rabbitmq_port", values.port, "5672", "Broker AMQP port."),
    Knob("RABBITMQ_USER", "rabbitmq_user", values.text, None,
         "Broker user (unset: pika's default, which RabbitMQ accepts from loopback only)."),
    Knob("RABBITMQ_PASSWORD", "rabbitmq_password", values.text, None,
         "Broker password; or RABBITMQ_PASSWORD_FILE, a file holding it (a Swarm secret; "
         "every password and URL knob has its `_FILE`).", secret=True),
    Knob("RABBITMQ_VHOST", "rabbitmq_vhost", values.text, "/", "Broker virtual host."),
    Knob("RABBITMQ_HEARTBEAT_S", "rabbitmq_heartbeat_s", values.non_negative_int, "30",
         "AMQP heartbeat; fetches run off the I/O thread so long fetches never miss it."),
    Knob("REDIS_URL", "redis_url_raw", values.redis_url, None,
         "Full Redis URL; when set it wins over the REDIS_* parts. A Redis Cluster is "
         "refused (use Sentinel).", url=True),
    Knob("REDIS_HOST", "redis_host", values.text, "localhost", "Redis host."),
    Knob("REDIS_PORT", "redis_port", values.port, "6379", "Redis port."),
    Knob("REDIS_DB", "redis_db", values.non_negative_int, "0", "Redis database number."),
    Knob("REDIS_PASSWORD", "redis_password", values.text, None,
         "Redis password (AUTH); or REDIS_PASSWORD_FILE, a file holding it.", secret=True),
    Knob("REDIS_SENTINELS", "redis_sentinels", values.host_ports, "",
         "Sentinels host:port,... : every process finds the primary through them and follows "
         "a failover (REDIS_URL then gives only the password, database and TLS). Empty: off."),
    Knob("REDIS_SENTINEL_MASTER", "redis_sentinel_master", values.text, "mymaster",
         "Name the sentinels monitor the primary under (`sentinel monitor NAME ...`)."),
    Knob("REDIS_SENTINEL_PASSWORD", "redis_sentinel_password", values.text, None,
         "Password of the sentinels themselves (their requirepass), if any; or "
         "REDIS_SENTINEL_PASSWORD_FILE.", secret=True),
    Knob("REDIS_MIN_REPLICAS", "redis_min_replicas", values.non_negative_int, "0",
         "A result counts as recorded (and its delivery is acked) only once this many replicas "
         "have it (WAIT); 0: off, no extra wait."),
    Knob("REDIS_WAIT_TIMEOUT_MS", "redis_wait_timeout_ms", values.positive_int, "1000",
         "One WAIT for those replicas; a late one is waited for again (the delivery unacked)..."),
    Knob("REDIS_WAIT_MAX_S", "redis_wait_max_s", values.non_negative_float, "300",
         "...for this long in all; then the delivery is processed again and acked on the "
         "primary's done mark. A demoted primary ends the wait at once: the page is redone on "
         "the new one."),
    Knob("CONNECT_RETRY_S", "connect_retry_s", values.non_negative_float, "30",
         "How long to retry reaching RabbitMQ/Redis (exponential backoff) before giving up "
         "(exit 3); `inf`: wait as long as it takes, saying so every 10 s (what compose and "
         "Swarm give the worker, sink and scheduler)."),
    Knob("WORKER_ID", "worker_id", values.text, None,
         "Worker id in logs and results (default: hostname-pid)."),
    Knob("WORKER_CONCURRENCY", "concurrency", values.positive_int, "8",
         "Parallel fetches per worker process; --concurrency overrides."),
    Knob("FETCH_LOOPS", "fetch_loops", values.positive_int, "1",
         "Threads driving the worker's fetches (libcurl multi, a greenlet per fetch), each "
         "with its share of WORKER_CONCURRENCY; one costs the least CPU per page (NOTES #26)."),
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
         "Redirect hops in all: followed within the origin, handed off as new URLs beyond it."),
    Knob("MAX_HEADER_BYTES", "max_header_bytes", values.positive_int, "65536",
         "Largest total size of response headers."),
    Knob("FETCH_TOTAL_TIMEOUT_S", "fetch_total_timeout_s", values.positive_float, "60",
         "Longest a whole fetch may take, redirects and a slow-drip body included."),
    Knob("ALLOWED_CONTENT_TYPES", "allowed_content_types", values.text,
         "text/html,application/xhtml+xml",
         "Content types whose body is read and parsed; others are recorded, not read."),
    Knob("RESULTS_MAXLEN", "results_maxlen", values.positive_int, "100000",
         "Approximate MAXLEN of the `results` stream."),
    Knob("MAX_URL_LENGTH", "max_url_length", values.positive_int, "2048",
         "Longest URL accepted by the producer."),
    Knob("SEEN_BUCKETS", "seen_buckets", values.power_of_two, "16384",
         "Number of small Redis sets the seen-fingerprints are spread over (power of two)."),
    Knob("PRODUCER_BATCH", "producer_batch", values.positive_int, "1000",
         "URLs per dedupe pipeline and confirm batch in the producer."),
    Knob("DEFER_LEAD_S", "defer_lead_s", values.non_negative_float, "10",
         "Fairness across domains: the producer publishes a domain's URLs at most this long "
         "before their turn at the domain's rate; the rest wait in Redis (deferred) and the "
         "workers release them on time, so a huge domain cannot bury the others (0: off)."),
    Knob("DEFER_BATCH", "defer_batch", values.positive_int, "500",
         "Deferred URLs a worker's releaser moves into RabbitMQ per claim."),
    Knob("DEFER_LEASE_S", "defer_lease_s", values.positive_float, "60",
         "How long a releaser owns a claimed batch of deferred URLs; a batch whose releaser "
         "died (kill -9) is claimed and published again after it."),
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
    Knob("ROBOTS_MAX_CRAWL_DELAY_S", "robots_max_crawl_delay_s", values.positive_float, "30",
         "Longest robots.txt Crawl-delay honoured (Bing's range ends at 30 s; Google ignores "
         "the line); a longer one means one request per this many seconds."),
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
    Knob("THROTTLE_BLOCK_START_S", "throttle_block_start_s", values.positive_float, "60",
         "A 429 or 503 without Retry-After blocks its whole domain, fleet-wide, this long the "
         "first time (with Retry-After: until then)..."),
    Knob("THROTTLE_BLOCK_FACTOR", "throttle_block_factor", values.positive_float, "2",
         "...times this for each new incident (answers to requests sent before the block "
         "ended are the same incident)..."),
    Knob("THROTTLE_BLOCK_MAX_S", "throttle_block_max_s", values.positive_float, "86400",
         "...at most this long."),
    Knob("THROTTLE_FORGIVE_S", "throttle_forgive_s", values.positive_float, "1800",
         "A domain with no 429, 503, timeout or slow answer for this long is forgiven: its "
         "block curve starts over and its configured rate is back."),
    Knob("THROTTLE_JITTER", "throttle_jitter", values.fraction, "0.1",
         "Up to this fraction is added at random to each block from the curve, so domains "
         "blocked together do not come back together."),
    Knob("THROTTLE_DECREASE", "throttle_decrease", values.fraction, "0.5",
         "A timeout or a slow answer multiplies the domain's rate by this (once per round "
         "of requests)..."),
    Knob("THROTTLE_INCREASE", "throttle_increase", values.fraction, "0.05",
         "...each healthy answer adds this fraction of its configured rate back, never above "
         "the configured rate..."),
    Knob("THROTTLE_RATE_FLOOR", "throttle_rate_floor", values.fraction, "0.05",
         "...and never below this fraction of it."),
    Knob("THROTTLE_SLOW_FACTOR", "throttle_slow_factor", values.positive_float, "4",
         "An answer is slow when it took longer than this multiple of the domain's median "
         "(over the worker's last 20 answers from it)..."),
    Knob("THROTTLE_SLOW_MIN_S", "throttle_slow_min_s", values.non_negative_float, "1",
         "...and longer than this."),
    Knob("MAX_WAIT_S", "max_wait_s", values.non_negative_float, "86400",
         "A URL whose turn (rate limit, blocked domain) would come later than this after it "
         "was first parked is dead-lettered `waited_too_long` (0: no limit)."),
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
    Knob("CRAWL_NOFOLLOW", "crawl_nofollow", values.boolean, "true",
         "Crawl mode honours `rel=\"nofollow\"` links and robots `nofollow` (meta tag, "
         "`X-Robots-Tag`); a follow rule's `nofollow` overrides it."),
    Knob("MAX_RECORD_BYTES", "max_record_bytes", values.positive_int, "65536",
         "Largest result record (JSON bytes); a longer one loses links first, then its `data`, "
         "then its longest fields, and is flagged `record_truncated`."),
    Knob("EXTRACT_RULES", "extract_rules", values.rules_ref, "",
         "Extraction rules: `@rules.yml`, `@rules.json` or inline JSON; the values go into "
         "each matching page's record under `data`. Validated at worker start. Empty: none."),
    Knob("EXTRACTOR", "extractor", values.text, "",
         "User extraction function `package.module:function`, called on each HTML page after "
         "the rules; its `data` wins over theirs. Imported at worker start. Empty: none."),
    Knob("HANDLERS", "handlers", values.text, "",
         "Your handlers: `package.module:router`, a `scrape_fleet.Router`; on each HTML page, "
         "after the rules, the handler its label, rule or URL pattern names runs in a child "
         "process (limits: EXTRACTOR_TIMEOUT_S, EXTRACTOR_MAX_MEMORY_BYTES). Imported at worker "
         "start; not with EXTRACTOR. Empty: none."),
    Knob("EXTRACTOR_TIMEOUT_S", "extractor_timeout_s", values.positive_float, "2",
         "An EXTRACTOR call (in its child process) taking longer is stopped: the child is "
         "killed, `data_errors.extractor` starts with `timeout:`."),
    Knob("EXTRACTOR_MAX_MEMORY_BYTES", "extractor_max_memory_bytes", values.positive_int,
         "536870912", "Address space of EXTRACTOR's child process (RLIMIT_AS); past it the "
         "call fails (`crashed:`) and a fresh child takes the next page."),
    Knob("RULES_REGEX_TIMEOUT_S", "rules_regex_timeout_s", values.positive_float, "1",
         "Time a page's extraction-rule regexes (`path`/`url`, fields' `regex`, follow "
         "`allow`/`deny`) may take together; past it the field is null with `timeout` in "
         "`data_errors`, the rest of the page's links are not followed (`data_errors.follow`)."),
    Knob("ARCHIVE", "archive", values.choice("none", "warc"), "none",
         "warc: every fetched response (any status, not cache hits) is kept as it was "
         "transferred, with its request, in gzip WARC 1.1 files under ARCHIVE_DIR; the result "
         "names the file and offset (`archive`). none: pages are not kept."),
    Knob("ARCHIVE_DIR", "archive_dir", values.text, "archive",
         "Directory of the WARC files (one writer per worker; `NAME.warc.gz.open` while "
         "written, `NAME.warc.gz` once closed)."),
    Knob("ARCHIVE_MAX_BYTES", "archive_max_bytes", values.positive_int, "1073741824",
         "A WARC file is closed and a new one started once it would pass this size."),
    Knob("ARCHIVE_FSYNC", "archive_fsync", values.boolean, "false",
         "fsync the WARC file before each result is stored (survives a power loss, not only "
         "a killed worker), at the cost of a disk flush per page."),
    Knob("RECORD_MAX_LINKS", "record_max_links", values.non_negative_int, "1000",
         "Links kept in a result record (crawl mode still follows every link it extracted)."),
    Knob("MAX_PAGE_TAGS", "max_page_tags", values.positive_int, "100000",
         "Tags (`<`) of a page parsed; the rest is cut and the record says `truncated: tags`."),
    Knob("POISON_DELIVERIES", "poison_deliveries", values.positive_int, "3",
         "Deliveries of a URL that ended without an outcome (its worker died) before it is "
         "dead-lettered as `poison`."),
    Knob("STUCK_PAGE_S", "stuck_page_s", values.positive_float, "30",
         "A page still parsing after this long marks its URL `poison` and restarts the worker "
         "(at least EXTRACTOR_TIMEOUT_S + RULES_REGEX_TIMEOUT_S + 5 s)."),
    Knob("REDIS_MEMORY_HIGH", "redis_memory_high", values.fraction, "0.9",
         "Workers stop taking deliveries while Redis uses more than this fraction of its "
         "maxmemory (no maxmemory: never)."),
    Knob("REDIS_MEMORY_LOW", "redis_memory_low", values.fraction, "0.8",
         "...and take them again below this fraction."),
    Knob("RESULTS_BACKLOG_HIGH", "results_backlog_high", values.positive_int, "80000",
         "Workers stop taking deliveries while a registered sink has more unwritten results "
         "and failure records than this..."),
    Knob("RESULTS_BACKLOG_LOW", "results_backlog_low", values.positive_int, "40000",
         "...and take them again below this."),
    Knob("PRESSURE_CHECK_S", "pressure_check_s", values.positive_float, "1",
         "How often a worker reads Redis memory and the sinks' backlog."),
    Knob("SINK", "sink", values.text, "",
         "What `scrape-fleet sink` runs when no kind is named: `files`, `postgres`, a name "
         "registered under the `scrape_fleet.sinks` entry point, or `package.module:Class`. "
         "Empty: `files`."),
    Knob("SINK_BATCH", "sink_batch", values.positive_int, "500",
         "Stream entries a sink reads, writes durably and acknowledges at a time."),
    Knob("SINK_DIR", "sink_dir", values.text, "results",
         "Directory of the files sink (gzip JSON Lines parts)."),
    Knob("SINK_ROTATE_BYTES", "sink_rotate_bytes", values.positive_int, "134217728",
         "A files-sink part is closed once its compressed size passes this..."),
    Knob("SINK_ROTATE_S", "sink_rotate_s", values.positive_float, "3600",
         "...or once it has been open this long."),
    Knob("POSTGRES_URL", "postgres_url", values.url_with_scheme("postgresql", "postgres"), None,
         "PostgreSQL for the postgres sink (postgresql://user:password@host:5432/db).",
         url=True),
    Knob("POSTGRES_TABLE", "postgres_table", values.identifier, "crawl_results",
         "Table the postgres sink upserts into (one row per URL)."),
    Knob("SCHEDULE_INTERVAL_S", "schedule_interval_s", values.positive_int, "86400",
         "Recrawl interval a scheduled URL starts with when neither `scheduler.py add "
         "--interval` nor its sitemap (changefreq, lastmod) says otherwise."),
    Knob("SCHEDULE_MIN_INTERVAL_S", "schedule_min_interval_s", values.positive_int, "3600",
         "Shortest recrawl interval: a page that changes at every visit converges to it."),
    Knob("SCHEDULE_MAX_INTERVAL_S", "schedule_max_interval_s", values.positive_int, "1209600",
         "Longest recrawl interval: a page that never changes converges to it (14 days)."),
    Knob("SCHEDULE_GROWTH", "schedule_growth", values.fraction, "0.5",
         "Unchanged (same content_hash, or 304): interval × (1 + this), up to the max."),
    Knob("SCHEDULE_SHRINK", "schedule_shrink", values.fraction, "0.5",
         "Changed: interval × (1 - this) + min × this, down to the min."),
    Knob("SCHEDULE_BATCH", "schedule_batch", values.positive_int, "500",
         "Due URLs the scheduler takes, publishes and reschedules at a time."),
    Knob("SCHEDULE_MAX_QUEUED", "schedule_max_queued", values.positive_int, "10000",
         "The scheduler publishes no batch while the work queues hold this many messages: due "
         "URLs wait in the schedule, not in queues whose TTL would expire them."),
    Knob("SCHEDULE_LEASE_S", "schedule_lease_s", values.positive_float, "10",
         "The active scheduler's lease; a killed one is replaced within about 1.25 × this."),
    Knob("METRICS_PORT", "metrics_port", values.non_negative_int, "0",
         "Port of the worker's Prometheus /metrics endpoint (0: off; compose sets 9100)."),
    Knob("METRICS_HOST", "metrics_host", values.text, "127.0.0.1",
         "Address METRICS_PORT listens on: loopback unless told (its labels name crawled "
         "domains); compose and Kubernetes set 0.0.0.0 for Prometheus and the probes."),
    Knob("HEARTBEAT_INTERVAL_S", "heartbeat_interval_s", values.positive_float, "5",
         "How often a worker refreshes its workers:{id} key (TTL: 3 intervals)."),
    Knob("RABBITMQ_MANAGEMENT_URL", "rabbitmq_management_url", values.url_list("http", "https"),
         None, "Management API for the status view's unacked counts and rates, or several "
         "comma-separated (a cluster: the first that answers) (default: port 15672 of each "
         "broker address, with the AMQP credentials; optional).", url=True),
    Knob("LOG_LEVEL", "log_level", values.log_level, "INFO", "Logging level."),
    Knob("LOG_FORMAT", "log_format", values.log_format, "text",
         "text, or json for one JSON object a line."),
)
