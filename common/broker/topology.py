"""RabbitMQ topology: every queue, exchange, binding and queue argument, decided here.

Every process (producer, sitemap producer, worker, stats, tests) calls :func:`declare` on a
fresh channel, so all of them declare the same objects with identical arguments; a mismatch
would make RabbitMQ refuse the declaration with PRECONDITION_FAILED.

Queues::

    priority_queue   durable, x-message-ttl 30 min, expired/rejected -> expired_exchange
    url_queue_ttl    durable, x-message-ttl 1 h,    expired/rejected -> expired_exchange
    failed_urls      durable, x-message-ttl 24 h, bound to failed_exchange (direct) key "failed"
    expired_urls     durable, x-message-ttl 24 h, bound to expired_exchange (fanout); messages
                     that outlived their TTL in a work queue land here so they are counted and
                     their seen-fingerprint can be released (see NOTES.md)
    hold.{ms}        durable, x-message-ttl {ms}, x-dead-letter-exchange "" (the default
                     exchange); fed by the fanout exchange hold.{ms}. A message published there
                     with routing key "priority_queue" or "url_queue_ttl" comes back to that
                     queue {ms} later. One queue per delay level: a per-message TTL only
                     expires at the head of a queue, so mixed delays in one queue would wait
                     for each other. Levels double from 100 ms; a longer delay takes several
                     hops (largest level first), see :func:`hold_level`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS

PRIORITY_QUEUE = "priority_queue"
NORMAL_QUEUE = "url_queue_ttl"
FAILED_QUEUE = "failed_urls"
EXPIRED_QUEUE = "expired_urls"

FAILED_EXCHANGE = "failed_exchange"
FAILED_ROUTING_KEY = "failed"
EXPIRED_EXCHANGE = "expired_exchange"

#: Work queues in the order a worker serves them (first = most urgent).
WORK_QUEUES: tuple[str, ...] = (PRIORITY_QUEUE, NORMAL_QUEUE)

#: Delay levels of the hold queues, in ms: 100 ms · 2^k up to about 55 minutes.
HOLD_LEVELS_MS: tuple[int, ...] = tuple(100 * 2 ** k for k in range(16))
#: A remaining delay below this is not worth another hop.
HOLD_MIN_MS = 50


def hold_name(level_ms: int) -> str:
    return f"hold.{level_ms}"


def hold_level(remaining_ms: float) -> int | None:
    """The hold level for the next hop of a delay: the largest level not above what remains,
    the smallest level for short remainders, None when the wait is over."""
    if remaining_ms < HOLD_MIN_MS:
        return None
    fitting = [level for level in HOLD_LEVELS_MS if level <= remaining_ms]
    return fitting[-1] if fitting else HOLD_LEVELS_MS[0]


@dataclass(frozen=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bind_exchange: str | None = None
    bind_key: str = ""


@dataclass(frozen=True)
class ExchangeSpec:
    name: str
    type: str


EXCHANGES: tuple[ExchangeSpec, ...] = (
    ExchangeSpec(FAILED_EXCHANGE, "direct"),
    ExchangeSpec(EXPIRED_EXCHANGE, "fanout"),
    *(ExchangeSpec(hold_name(level), "fanout") for level in HOLD_LEVELS_MS),
)

QUEUES: tuple[QueueSpec, ...] = (
    QueueSpec(PRIORITY_QUEUE, {"x-message-ttl": 30 * MINUTE_MS,
                               "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(NORMAL_QUEUE, {"x-message-ttl": HOUR_MS,
                             "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(FAILED_QUEUE, {"x-message-ttl": 24 * HOUR_MS},
              bind_exchange=FAILED_EXCHANGE, bind_key=FAILED_ROUTING_KEY),
    QueueSpec(EXPIRED_QUEUE, {"x-message-ttl": 24 * HOUR_MS},
              bind_exchange=EXPIRED_EXCHANGE),
    *(QueueSpec(hold_name(level), {"x-message-ttl": level, "x-dead-letter-exchange": ""},
                bind_exchange=hold_name(level)) for level in HOLD_LEVELS_MS),
)

QUEUE_TTL_MS: dict[str, int] = {q.name: q.arguments["x-message-ttl"] for q in QUEUES}


def declare(channel: Any) -> None:
    """Declare every exchange, queue and binding on ``channel`` (a pika BlockingChannel).

    Idempotent: re-declaring with the same arguments is a no-op on the broker.
    """
    for exchange in EXCHANGES:
        channel.exchange_declare(exchange=exchange.name, exchange_type=exchange.type, durable=True)
    for queue in QUEUES:
        channel.queue_declare(queue=queue.name, durable=True, arguments=queue.arguments)
        if queue.bind_exchange:
            channel.queue_bind(queue=queue.name, exchange=queue.bind_exchange,
                               routing_key=queue.bind_key)


def delete_all(channel: Any) -> None:
    """Delete every queue and exchange this module declares (tests and `stats --reset`)."""
    for queue in QUEUES:
        channel.queue_delete(queue=queue.name)
    for exchange in EXCHANGES:
        channel.exchange_delete(exchange=exchange.name)
