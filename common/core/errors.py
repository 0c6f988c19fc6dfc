"""Error classes, in one place.

Library exceptions (pika, redis, pycurl) are translated at the boundary into these, with
``raise X(...) from None`` where the original adds nothing. Each class says what the caller
should do with it: fail fast at start, retry later, or dead-letter at once. The library
exceptions that mean "the service is gone for now" are named here once, as tuples.
"""

from __future__ import annotations

import pika.exceptions
import redis


class FleetError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(FleetError):
    """A setting is missing or malformed. Raised at start-up; the message names the variable."""


class TopologyMismatch(ConfigError):
    """A queue exists with other arguments than QUEUE_TYPE asks for (PRECONDITION_FAILED): an
    operator decision, never retried; the message says how to migrate."""


class ServiceUnavailable(FleetError):
    """RabbitMQ or Redis cannot be reached after retrying with backoff."""


class ReplicaTimeout(FleetError, redis.TimeoutError):
    """Fewer replicas than REDIS_MIN_REPLICAS confirmed a result within REDIS_WAIT_TIMEOUT_MS.

    The result is on the primary but not yet safe from a failover, so its delivery must not be
    acked: a ``redis.TimeoutError`` (hence in :data:`REDIS_UNAVAILABLE`), it is held and
    processed again like any Redis outage, and the URL's done mark keeps that to one result.
    """


class PublishError(FleetError):
    """A publish was nacked, returned as unroutable, or its channel closed before the confirm."""


class InvalidURL(FleetError):
    """A URL that can never be fetched: bad scheme, no host, too long, unparsable."""

    reason = "invalid_url"


class BadMessage(FleetError):
    """A queue message that is not a JSON object with a string ``url`` (a poison message)."""

    reason = "bad_message"


class FetchError(FleetError):
    """A fetch that failed before any HTTP status was received (timeouts, connection errors)."""

    def __init__(self, message: str, *, kind: str, sent_at: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.sent_at = sent_at  # when the request left, if it did

    @property
    def transient(self) -> bool:
        """Worth retrying later: the network or the server may recover."""
        return self.kind in TRANSIENT_FETCH_KINDS


# -- the services going away: reconnect (broker) or hold the work and retry (Redis) -----------

#: The broker connection or channel is gone: reconnect; the broker redelivers what was unacked.
AMQP_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError,
    pika.exceptions.StreamLostError, pika.exceptions.ConnectionWrongStateError)

#: Redis cannot answer right now (down, loading, a read-only replica after a failover; with
#: Sentinel, no primary known yet: MasterNotFoundError, a ConnectionError; replicas behind:
#: ReplicaTimeout, a TimeoutError). On a Redis Cluster, a failover in progress: CLUSTERDOWN
#: (and MASTERDOWN), TRYAGAIN, a slot no node serves yet, a MOVED our node-level WAIT
#: pipeline meets (common/store/results.py).
REDIS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.ReadOnlyError,
    redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError, redis.exceptions.AskError)


# -- classification: what happens to a URL after each kind of failure -------------------------

#: FetchError kinds that are retried with backoff; every other kind dead-letters at once.
#: ``proxy``: the proxy failed, not the site; the URL goes through another one.
TRANSIENT_FETCH_KINDS = frozenset({"timeout", "connection", "proxy"})

OK = "ok"
PERMANENT = "permanent"
TRANSIENT = "transient"


def classify_status(status: int) -> str:
    """``ok`` (record the result), ``transient`` (retry with backoff: 408, 429, 5xx) or
    ``permanent`` (dead-letter at once, no retry: 404, 410 and every other 4xx)."""
    if status in (408, 429) or status >= 500:
        return TRANSIENT
    if status >= 400:
        return PERMANENT
    return OK
