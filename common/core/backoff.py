"""Waits before trying again: a URL's retry (backoff, or the server's Retry-After) and a
reconnect to RabbitMQ or Redis. Both are exponential with "equal jitter"."""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    stop_when_event_set,
)

from common.core.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")


def compute_backoff_s(failures: int, *, base_s: float, max_s: float,
                      rng: random.Random | None = None) -> float:
    """Delay before retry number ``failures`` (1-based): base·2^(n-1), capped, "equal jitter"
    (half fixed, half random) so retries of many URLs that failed together spread out but
    never come back at once."""
    # The exponent is clamped: 2.0 ** 1100 overflows a float, and 62 doublings pass any cap.
    ceiling = min(max_s, base_s * 2.0 ** min(62, max(0, failures - 1)))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def parse_retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def retry_delay_s(failures: int, retry_after: str | None, *, base_s: float, max_s: float,
                  retry_after_max_s: float) -> float:
    """The delay before the next attempt: the backoff, or the server's Retry-After (capped at
    ``retry_after_max_s``) when that asks for longer."""
    delay = compute_backoff_s(failures, base_s=base_s, max_s=max_s)
    asked = parse_retry_after_s(retry_after)
    if asked is not None:
        delay = max(delay, min(asked, retry_after_max_s))
    return delay


# -- reconnecting to RabbitMQ and Redis -----------------------------------------------------------

#: First and longest wait between attempts to reach a service that went away.
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0


def reconnect_delay_s(attempt: int, rng: random.Random | None = None) -> float:
    """Wait before reconnect attempt ``attempt`` (1-based): the one policy for both services,
    used between connect attempts and between sessions of a worker whose broker went away."""
    return compute_backoff_s(attempt, base_s=RECONNECT_FIRST_S * 2, max_s=RECONNECT_MAX_S,
                             rng=rng)


#: How often a process waiting for RabbitMQ or Redis says it is still waiting.
WAITING_LOG_EVERY_S = 10.0


def keep_trying(connect: Callable[[], T], *, timeout_s: float,
                retry_on: tuple[type[BaseException], ...], service: str, where: str,
                stop: threading.Event | None = None) -> T:
    """``connect()`` until it returns, retrying ``retry_on`` errors with the reconnect policy.
    ``timeout_s`` may be ``inf`` (CONNECT_RETRY_S=inf: a container started before its broker
    waits for it); either way the wait is logged once at the first failure, then every
    :data:`WAITING_LOG_EVERY_S`. ``stop`` (a worker's stop request) ends the wait at once.

    Raises:
        ServiceUnavailable: still failing after ``timeout_s``, or ``stop`` set, naming the
            service, where it was looked for and the last error. Errors outside ``retry_on``
            pass through.
    """
    try:
        for attempt in reconnecting(timeout_s, retry_on, service, where, stop):
            with attempt:
                return connect()
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        waited = ("stopped while waiting" if stop is not None and stop.is_set()
                  else f"unreachable after {timeout_s:g}s")
        raise ServiceUnavailable(f"{service} at {where} {waited}: "
                                 f"{type(cause).__name__}: {cause}") from None
    raise AssertionError("unreachable")  # pragma: no cover - Retrying either returns or raises


def reconnecting(timeout_s: float, retry_on: tuple[type[BaseException], ...],
                 service: str, where: str, stop: threading.Event | None = None) -> Retrying:
    """A tenacity ``Retrying`` that tries ``service`` again with :func:`reconnect_delay_s`
    while ``retry_on`` is raised, saying "waiting for SERVICE at WHERE" at the first failure
    and every :data:`WAITING_LOG_EVERY_S` after (each attempt at debug), and gives up after
    ``timeout_s`` or as soon as ``stop`` is set."""
    limit = "no time limit" if math.isinf(timeout_s) else f"giving up after {timeout_s:g} s"
    next_log_s = [0.0]

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        waited_s = state.seconds_since_start or 0.0
        logger.debug("%s at %s unreachable (%s: %s); retry %d in %.1fs", service, where,
                     type(exc).__name__, exc, state.attempt_number,
                     state.next_action.sleep if state.next_action else 0.0)
        if waited_s >= next_log_s[0]:
            next_log_s[0] = waited_s + WAITING_LOG_EVERY_S
            logger.warning("waiting for %s at %s (%s: %s): %.0f s so far, %s (CONNECT_RETRY_S)",
                           service, where, type(exc).__name__, exc, waited_s, limit)

    stopped = stop or threading.Event()
    return Retrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop_after_delay(timeout_s) | stop_when_event_set(stopped),
        wait=lambda state: reconnect_delay_s(state.attempt_number),
        sleep=stopped.wait,  # a stop request wakes the wait
        before_sleep=log_retry,
        reraise=False,
    )
