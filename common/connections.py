"""Connections to RabbitMQ and Redis, retried with exponential backoff (tenacity).

Both functions fail fast with :class:`ServiceUnavailable` once ``settings.connect_retry_s`` has
passed, so an entry script can print one clear line and exit non-zero.
"""

from __future__ import annotations

import logging
from typing import Any

import pika
import pika.exceptions
import redis
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from common.config import Settings
from common.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

# Errors that mean "not reachable yet": worth retrying. Authentication failures and bad vhosts
# are not in this list: retrying them only delays the operator's fix.
_AMQP_RETRYABLE = (pika.exceptions.AMQPConnectionError, OSError)
_AMQP_FATAL = (pika.exceptions.ProbableAuthenticationError,
               pika.exceptions.ProbableAccessDeniedError)
_REDIS_RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def _retrying(settings: Settings, retry_on: tuple[type[BaseException], ...],
              service: str) -> Retrying:
    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        logger.warning("%s unreachable (%s: %s); retry %d in %.1fs", service,
                       type(exc).__name__, exc, state.attempt_number,
                       state.next_action.sleep if state.next_action else 0.0)

    return Retrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop_after_delay(settings.connect_retry_s),
        wait=wait_exponential_jitter(multiplier=0.2, max=5.0),
        before_sleep=log_retry,
        reraise=False,
    )


def amqp_parameters(settings: Settings) -> pika.URLParameters:
    params = pika.URLParameters(settings.rabbitmq_url)
    params.heartbeat = settings.rabbitmq_heartbeat_s
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    params.socket_timeout = 10
    params.client_properties = {"connection_name": f"scrape-fleet {settings.worker_id}"}
    return params


def connect_rabbitmq(settings: Settings) -> pika.BlockingConnection:
    """A BlockingConnection to the broker, retried with backoff.

    Raises:
        ServiceUnavailable: the broker refused our credentials or stayed unreachable.
    """
    params = amqp_parameters(settings)
    where = f"{params.host}:{params.port}{params.virtual_host}"
    try:
        for attempt in _retrying(settings, _AMQP_RETRYABLE, "RabbitMQ"):
            with attempt:
                try:
                    return pika.BlockingConnection(params)
                except _AMQP_FATAL as exc:
                    raise ServiceUnavailable(
                        f"RabbitMQ at {where} refused the login ({type(exc).__name__}); "
                        "check RABBITMQ_USER/RABBITMQ_PASSWORD/RABBITMQ_VHOST") from None
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise ServiceUnavailable(
            f"RabbitMQ at {where} unreachable after {settings.connect_retry_s:g}s: "
            f"{type(cause).__name__}: {cause}") from None
    raise AssertionError("unreachable")  # pragma: no cover - Retrying either returns or raises


def connect_redis(settings: Settings, **kwargs: Any) -> redis.Redis:
    """A Redis client that has answered PING, retried with backoff.

    Raises:
        ServiceUnavailable: Redis refused our password or stayed unreachable.
    """
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10,
                                  socket_connect_timeout=5, health_check_interval=30, **kwargs)
    where = client.connection_pool.connection_kwargs.get("host", "redis")
    try:
        for attempt in _retrying(settings, _REDIS_RETRYABLE, "Redis"):
            with attempt:
                try:
                    client.ping()
                except redis.AuthenticationError as exc:
                    raise ServiceUnavailable(f"Redis at {where} refused the login: {exc}; "
                                             "check REDIS_PASSWORD") from None
                return client
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise ServiceUnavailable(
            f"Redis at {where} unreachable after {settings.connect_retry_s:g}s: "
            f"{type(cause).__name__}: {cause}") from None
    raise AssertionError("unreachable")  # pragma: no cover
