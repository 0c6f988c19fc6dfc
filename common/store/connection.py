"""The Redis client every process uses: PING answered, retried with the reconnect policy."""

from __future__ import annotations

from typing import Any

import redis

from common.core.backoff import keep_trying
from common.core.config import Settings
from common.core.errors import REDIS_UNAVAILABLE, ServiceUnavailable


def connect_redis(settings: Settings, **kwargs: Any) -> redis.Redis:
    """A Redis client that has answered PING, retried with backoff.

    Raises:
        ServiceUnavailable: Redis refused our password or stayed unreachable.
    """
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10,
                                  socket_connect_timeout=5, health_check_interval=30, **kwargs)
    where = client.connection_pool.connection_kwargs.get("host", "redis")

    def connect() -> redis.Redis:
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise ServiceUnavailable(f"Redis at {where} refused the login: {exc}; "
                                     "check REDIS_PASSWORD") from None
        return client

    return keep_trying(connect, timeout_s=settings.connect_retry_s, retry_on=REDIS_UNAVAILABLE,
                       service="Redis", where=where)
