"""The Redis client every process uses: one factory, PING answered, retried with the reconnect
policy.

Without Sentinel it is a plain client of REDIS_URL (or the REDIS_* parts). With
REDIS_SENTINELS it is redis-py's Sentinel client of the primary named REDIS_SENTINEL_MASTER:
each new connection asks the sentinels where the primary is, so after a failover the next
command reaches the promoted replica. What a failover looks like to the callers — the old
primary gone (ConnectionError), no primary agreed on yet (MasterNotFoundError, a
ConnectionError), a demoted primary answering READONLY (turned into a ConnectionError by
redis-py's Sentinel connection) — is all in :data:`~common.core.errors.REDIS_UNAVAILABLE`, so
the callers' existing hold-and-retry covers it. Registered Lua scripts survive a failover:
redis-py's Script loads its script again on NOSCRIPT.

A Redis Cluster is named by its nodes, ``REDIS_URL=redis+cluster://[user:password@]host:port,
host:port``: redis-py's RedisCluster, its keys tagged so every script's keys share one hash
slot (common/store/slots.py, docs/design-redis-cluster.md). It retries nothing either (a
ConnectionError reloads its slot map; our callers hold and retry), a failover's CLUSTERDOWN and
TRYAGAIN are in REDIS_UNAVAILABLE, and it follows MOVED itself. A plain REDIS_URL that reaches
a cluster node is refused at connect, naming the cluster URL.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from common.core.backoff import keep_trying
from common.core.config import Settings
from common.core.errors import REDIS_UNAVAILABLE, ConfigError, ServiceUnavailable
from common.core.values import CLUSTER_NODE, CLUSTER_SCHEMES
from common.store import slots

logger = logging.getLogger(__name__)

#: Every client's socket options. A command's bound is socket_timeout (fetch_threads.py).
CLIENT_OPTIONS: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5,
                                  "health_check_interval": 30}
#: Asking a sentinel is quick or useless: a silent one is skipped for the next at once
#: (redis-py's default would retry it 10 times with backoff first).
SENTINEL_TIMEOUT_S = 1.0


class FleetRedis(redis.Redis):
    """A ``redis.Redis`` that also carries the deployment's durability rule, so every store
    built on the client obeys it: a result counts as recorded once ``min_replicas`` replicas
    confirmed it (0: no WAIT), each WAIT ``wait_timeout_ms``, ``wait_max_s`` in all
    (common/store/results.py)."""

    min_replicas: int = 0
    wait_timeout_ms: int = 0
    wait_max_s: float = 0.0


class FleetRedisCluster(RedisCluster):
    """A Redis Cluster client with :class:`FleetRedis`'s durability rule."""

    min_replicas: int = 0
    wait_timeout_ms: int = 0
    wait_max_s: float = 0.0


def cluster_nodes(url: str) -> list[tuple[str, int]] | None:
    """The nodes a ``redis+cluster://`` URL names; None for any other URL."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in CLUSTER_SCHEMES:
        return None
    nodes = []
    for address in parts.netloc.rpartition("@")[2].split(","):
        host, _colon, port = address.strip().rpartition(":")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def _cluster_client(settings: Settings, nodes: list[tuple[str, int]],
                    options: dict[str, Any]) -> FleetRedisCluster:
    """The RedisCluster of ``nodes``; the password and user from REDIS_URL.

    Raises:
        ConfigError: with REDIS_SENTINELS.
    """
    if settings.redis_sentinels:
        raise ConfigError("REDIS_SENTINELS and a redis+cluster:// REDIS_URL: choose one")
    parts = urlsplit(settings.redis_url)
    if parts.username:
        options.setdefault("username", unquote(parts.username))
    if parts.password:
        options.setdefault("password", unquote(parts.password))
    if parts.scheme.lower().startswith("rediss"):
        options.setdefault("ssl", True)
    slots.set_cluster(True)
    return FleetRedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes],
                             retry=Retry(NoBackoff(), 0), **options)


def redis_client(settings: Settings, **kwargs: Any) -> FleetRedis:  # or FleetRedisCluster
    """The client ``settings`` describe, not connected yet (:func:`connect_redis` checks it).

    Raises:
        ConfigError: REDIS_SENTINELS with a ``unix://`` REDIS_URL.
    """
    options = {**CLIENT_OPTIONS, **kwargs}
    client: FleetRedis | FleetRedisCluster
    nodes = cluster_nodes(settings.redis_url)
    slots.set_cluster(False)
    if nodes is not None:
        client = _cluster_client(settings, nodes, options)
    elif not settings.redis_sentinels:
        client = FleetRedis.from_url(settings.redis_url, **options)
    else:
        sentinel = Sentinel(list(settings.redis_sentinels), sentinel_kwargs={
            "password": settings.redis_sentinel_password, "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S, "retry": Retry(NoBackoff(), 0)})
        client = sentinel.master_for(settings.redis_sentinel_master, redis_class=FleetRedis,
                                     **{**_primary_options(settings.redis_url), **options})
    client.min_replicas = settings.redis_min_replicas
    client.wait_timeout_ms = settings.redis_wait_timeout_ms
    client.wait_max_s = settings.redis_wait_max_s
    return client


def _primary_options(url: str) -> dict[str, Any]:
    """What REDIS_URL still says when the sentinels give the address: the password, user,
    database and TLS."""
    options = parse_url(url)
    connection_class = options.pop("connection_class", None)
    if connection_class is UnixDomainSocketConnection:
        raise ConfigError("REDIS_SENTINELS: REDIS_URL must be a redis:// or rediss:// URL "
                          "(its host is replaced by the primary the sentinels name), not unix://")
    for address in ("host", "port", "path"):
        options.pop(address, None)
    if connection_class is SSLConnection:
        options["ssl"] = True
    return options


def describe(settings: Settings) -> str:
    """Where Redis is looked for, for messages (never a password)."""
    nodes = cluster_nodes(settings.redis_url)
    if nodes is not None:
        return "Redis Cluster " + ",".join(f"{host}:{port}" for host, port in nodes)
    if settings.redis_sentinels:
        sentinels = ",".join(f"{host}:{port}" for host, port in settings.redis_sentinels)
        return f"primary {settings.redis_sentinel_master!r} of Sentinel {sentinels}"
    client_kwargs = parse_url(settings.redis_url)
    if client_kwargs.get("host"):
        return f"{client_kwargs['host']}:{client_kwargs.get('port', 6379)}"
    return str(client_kwargs.get("path") or "redis")


def connect_redis(settings: Settings, *, not_on_cluster: str = "", **kwargs: Any) -> FleetRedis:
    """A Redis client that has answered PING, retried with backoff. ``not_on_cluster``: what
    the caller is (the job runner, the scheduler...), when it does not run on a Redis Cluster.

    Raises:
        ServiceUnavailable: Redis (or the sentinels) refused our password or stayed
            unreachable.
        ConfigError: a plain REDIS_URL at a Redis Cluster node; ``not_on_cluster`` given
            with a cluster REDIS_URL.
    """
    if not_on_cluster and cluster_nodes(settings.redis_url) is not None:
        raise ConfigError(f"{not_on_cluster} does not run on a Redis Cluster yet: its scripts "
                          "keep fleet-wide keys together (docs/design-redis-cluster.md); "
                          "only the crawl path (producers, workers, sinks) does")
    client = redis_client(settings, **kwargs)
    where = describe(settings)

    def connect() -> FleetRedis:
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise ServiceUnavailable(f"Redis at {where} refused the login: {exc}; "
                                     "check REDIS_PASSWORD") from None
        except MasterNotFoundError as exc:
            if "AuthenticationError" in str(exc):
                raise ServiceUnavailable(f"the sentinels refused the login ({where}); check "
                                         "REDIS_SENTINEL_PASSWORD") from None
            raise
        if not slots.cluster() and _cluster_enabled(client):
            raise ConfigError(f"Redis at {where} {CLUSTER_NODE}")
        return client

    return keep_trying(connect, timeout_s=settings.connect_retry_s, retry_on=REDIS_UNAVAILABLE,
                       service="Redis", where=where)


def _cluster_enabled(client: redis.Redis) -> bool:
    """INFO's ``cluster_enabled``; a server that will not say (INFO not allowed) is taken as a
    single node: the first multi-key script would then fail with CROSSSLOT."""
    try:
        return bool(int(client.info("cluster").get("cluster_enabled", 0)))
    except redis.ResponseError as exc:
        logger.warning("Redis would not answer INFO cluster (%s); assuming a single node", exc)
        return False
