"""Waits before trying again: a URL's retry (backoff, or the server's Retry-After) and a
reconnect to RabbitMQ or Redis. Both are exponential with "equal jitter"."""

from __future__ import annotations

import logging
import random
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


def keep_trying(connect: Callable[[], T], *, timeout_s: float,
                retry_on: tuple[type[BaseException], ...], service: str, where: str) -> T:
    """``connect()`` until it returns, retrying ``retry_on`` errors with the reconnect policy.

    Raises:
        ServiceUnavailable: still failing after ``timeout_s``, naming the service, where it
            was looked for and the last error. Errors outside ``retry_on`` pass through.
    """
    try:
        for attempt in reconnecting(timeout_s, retry_on, service):
            with attempt:
                return connect()
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise ServiceUnavailable(f"{service} at {where} unreachable after {timeout_s:g}s: "
                                 f"{type(cause).__name__}: {cause}") from None
    raise AssertionError("unreachable")  # pragma: no cover - Retrying either returns or raises


def reconnecting(timeout_s: float, retry_on: tuple[type[BaseException], ...],
                 service: str) -> Retrying:
    """A tenacity ``Retrying`` that tries ``service`` again with :func:`reconnect_delay_s`
    while ``retry_on`` is raised, logging each wait, and gives up after ``timeout_s``."""

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        logger.warning("%s unreachable (%s: %s); retry %d in %.1fs", service,
                       type(exc).__name__, exc, state.attempt_number,
                       state.next_action.sleep if state.next_action else 0.0)

    return Retrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop_after_delay(timeout_s),
        wait=lambda state: reconnect_delay_s(state.attempt_number),
        before_sleep=log_retry,
        reraise=False,
    )
