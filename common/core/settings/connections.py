"""Settings groups of the services every process connects to: RabbitMQ, Redis, and how long
to keep trying to reach them.

Each field is declared once with :func:`~common.core.settings.declare.setting`: its variable,
parser, default text (parsed: the field's default) and meaning (the configuration reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from common.core import values
from common.core.settings.declare import SettingsGroup, setting


@dataclass(frozen=True, repr=False)
class BrokerSettings(SettingsGroup):
    """Where RabbitMQ is and how the fleet's queues are made."""

    rabbitmq_url_raw: str | None = setting(
        "RABBITMQ_URL", values.url_list("amqp", "amqps"), None,
        "Full AMQP URL (or several, comma-separated: a cluster's nodes); when set it wins "
        "over the RABBITMQ_* parts.", url=True)
    rabbitmq_urls_raw: str | None = setting(
        "RABBITMQ_URLS", values.url_list("amqp", "amqps"), None,
        "AMQP URLs of a cluster's nodes, comma-separated; wins over RABBITMQ_URL. Every "
        "process connects to a live one (random order) and moves to another when it dies.",
        url=True)
    queue_type: str = setting(
        "QUEUE_TYPE", values.choice("classic", "quorum"), "classic",
        "classic (one broker), or quorum: replicated queues for a RabbitMQ cluster, "
        "at-least-once dead-lettering, a delivery limit (NOTES #40). Decided "
        "at deployment: switching needs new queues.")
    rabbitmq_host: str = setting("RABBITMQ_HOST", values.text, "localhost", "Broker host.")
    rabbitmq_port: int = setting("RABBITMQ_PORT", values.port, "5672", "Broker AMQP port.")
    rabbitmq_user: str | None = setting(
        "RABBITMQ_USER", values.text, None,
        "Broker user (unset: pika's default, which RabbitMQ accepts from loopback only).")
    rabbitmq_password: str | None = setting(
        "RABBITMQ_PASSWORD", values.text, None,
        "Broker password; or RABBITMQ_PASSWORD_FILE, a file holding it (a Swarm secret; "
        "every password and URL knob has its `_FILE`).", secret=True)
    rabbitmq_vhost: str = setting("RABBITMQ_VHOST", values.text, "/", "Broker virtual host.")
    rabbitmq_heartbeat_s: int = setting(
        "RABBITMQ_HEARTBEAT_S", values.non_negative_int, "30",
        "AMQP heartbeat; fetches run off the I/O thread so long fetches never miss it.")

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


@dataclass(frozen=True, repr=False)
class RedisSettings(SettingsGroup):
    """Where Redis is: one primary, or Sentinel's, and how many replicas a result waits for."""

    redis_url_raw: str | None = setting(
        "REDIS_URL", values.redis_url, None,
        "Full Redis URL; when set it wins over the REDIS_* parts. A Redis Cluster: "
        "redis+cluster://host:port,host:port (the crawl path only; docs/design-redis-cluster.md)"
        ".", url=True)
    redis_host: str = setting("REDIS_HOST", values.text, "localhost", "Redis host.")
    redis_port: int = setting("REDIS_PORT", values.port, "6379", "Redis port.")
    redis_db: int = setting("REDIS_DB", values.non_negative_int, "0", "Redis database number.")
    redis_password: str | None = setting(
        "REDIS_PASSWORD", values.text, None,
        "Redis password (AUTH); or REDIS_PASSWORD_FILE, a file holding it.", secret=True)
    redis_sentinels: tuple[tuple[str, int], ...] = setting(
        "REDIS_SENTINELS", values.host_ports, "",
        "Sentinels host:port,... : every process finds the primary through them and follows "
        "a failover (REDIS_URL then gives only the password, database and TLS). Empty: off.")
    redis_sentinel_master: str = setting(
        "REDIS_SENTINEL_MASTER", values.text, "mymaster",
        "Name the sentinels monitor the primary under (`sentinel monitor NAME ...`).")
    redis_sentinel_password: str | None = setting(
        "REDIS_SENTINEL_PASSWORD", values.text, None,
        "Password of the sentinels themselves (their requirepass), if any; or "
        "REDIS_SENTINEL_PASSWORD_FILE.", secret=True)
    redis_min_replicas: int = setting(
        "REDIS_MIN_REPLICAS", values.non_negative_int, "0",
        "A result counts as recorded (and its delivery is acked) only once this many replicas "
        "have it (WAIT); 0: off, no extra wait.")
    redis_wait_timeout_ms: int = setting(
        "REDIS_WAIT_TIMEOUT_MS", values.positive_int, "1000",
        "One WAIT for those replicas; a late one is waited for again (the delivery unacked)...")
    redis_wait_max_s: float = setting(
        "REDIS_WAIT_MAX_S", values.non_negative_float, "300",
        "...for this long in all; then the delivery is processed again and acked on the "
        "primary's done mark. A demoted primary ends the wait at once: the page is redone on "
        "the new one.")

    @property
    def redis_url(self) -> str:
        """The Redis URL, from REDIS_URL or built from the parts."""
        if self.redis_url_raw:
            return self.redis_url_raw
        auth = f":{quote(self.redis_password, safe='')}@" if self.redis_password else ""
        return f"redis://{auth}{self.redis_host}:{self.redis_port}/{self.redis_db}"


@dataclass(frozen=True, repr=False)
class ReconnectSettings(SettingsGroup):
    """How long a process tries to reach RabbitMQ and Redis."""

    connect_retry_s: float = setting(
        "CONNECT_RETRY_S", values.non_negative_float, "30",
        "How long to retry reaching RabbitMQ/Redis (exponential backoff) before giving up "
        "(exit 3); `inf`: wait as long as it takes, saying so every 10 s (what compose and "
        "Swarm give the worker, sink and scheduler).")
