"""RabbitMQ topology: every queue, exchange, binding and queue argument, decided here.

Every process (producer, sitemap producer, worker, stats, tests) calls :func:`declare` on a
fresh channel, so all of them declare the same objects with identical arguments; a mismatch
would make RabbitMQ refuse the declaration with PRECONDITION_FAILED.

Queues::

    priority_queue   durable, x-message-ttl 30 min, expired/rejected -> expired_exchange
    url_queue_ttl    durable, x-message-ttl 1 h,    expired/rejected -> expired_exchange
    render_priority  as priority_queue, and
    render_queue     as url_queue_ttl, for the pages a browser renders: consumed by the
                     render workers only (``scrape-fleet work --render``), so plain pages
                     never wait behind a browser and render workers scale on their own
    media_priority   as priority_queue, and
    media_queue      as url_queue_ttl, for the assets a page references (images, PDFs...):
                     consumed by the download workers only (``scrape-fleet work --media``)
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

Queue types (QUEUE_TYPE, :func:`queue_arguments`): ``classic`` declares exactly the arguments
above. ``quorum`` declares the same queues as replicated quorum queues (a RabbitMQ cluster) and
adds, per queue: ``x-queue-type: quorum``; where a queue dead-letters (work and hold queues)
``x-dead-letter-strategy: at-least-once`` with the ``x-overflow: reject-publish`` it requires
(no length limit is set, so nothing is ever refused for length); and ``x-delivery-limit``: the
poison guard, DELIVERY_LIMIT on the work queues (past it the broker dead-letters the message
into expired_urls, x-death reason ``delivery_limit``), BROWSE_DELIVERY_LIMIT on failed_urls
and expired_urls, whose messages are returned on purpose (``dlq.py list`` browses by
returning). Quorum queues have no message priority (``x-max-priority`` is refused): none is
used here, priority is a queue of its own. Both work on RabbitMQ 3.10 to 4.x (NOTES.md #40).

A queue that exists with other arguments (the other QUEUE_TYPE, an older version) makes the
declaration fail with PRECONDITION_FAILED; :func:`declare` turns that into a
:class:`~common.core.errors.TopologyMismatch` saying how to migrate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pika.exceptions

from common.core.errors import TopologyMismatch

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS

PRIORITY_QUEUE = "priority_queue"
NORMAL_QUEUE = "url_queue_ttl"
FAILED_QUEUE = "failed_urls"
EXPIRED_QUEUE = "expired_urls"

FAILED_EXCHANGE = "failed_exchange"
FAILED_ROUTING_KEY = "failed"
EXPIRED_EXCHANGE = "expired_exchange"

RENDER_PRIORITY_QUEUE = "render_priority"
RENDER_QUEUE = "render_queue"
MEDIA_PRIORITY_QUEUE = "media_priority"
MEDIA_QUEUE = "media_queue"

#: Work queues in the order a worker serves them (first = most urgent).
WORK_QUEUES: tuple[str, ...] = (PRIORITY_QUEUE, NORMAL_QUEUE)
#: The render workers' queues, in the same order.
RENDER_QUEUES: tuple[str, ...] = (RENDER_PRIORITY_QUEUE, RENDER_QUEUE)
#: Every queue a page waits in for a worker.
PAGE_QUEUES: tuple[str, ...] = WORK_QUEUES + RENDER_QUEUES
#: The download workers' queues, in the same order.
MEDIA_QUEUES: tuple[str, ...] = (MEDIA_PRIORITY_QUEUE, MEDIA_QUEUE)
#: Every queue a worker of some kind consumes URLs from.
CONSUMED_QUEUES: tuple[str, ...] = PAGE_QUEUES + MEDIA_QUEUES
#: A work queue's media twin: where the assets its pages reference go.
MEDIA_TWIN: dict[str, str] = {PRIORITY_QUEUE: MEDIA_PRIORITY_QUEUE, NORMAL_QUEUE: MEDIA_QUEUE}
#: A work queue's render twin: where a page that needs a browser goes from it.
RENDER_TWIN: dict[str, str] = {PRIORITY_QUEUE: RENDER_PRIORITY_QUEUE,
                               NORMAL_QUEUE: RENDER_QUEUE,
                               RENDER_PRIORITY_QUEUE: RENDER_PRIORITY_QUEUE,
                               RENDER_QUEUE: RENDER_QUEUE}

#: Delay levels of the hold queues, in ms: 100 ms · 2^k up to about 55 minutes.
HOLD_LEVELS_MS: tuple[int, ...] = tuple(100 * 2 ** k for k in range(16))
#: A remaining delay below this is not worth another hop.
HOLD_MIN_MS = 50

CLASSIC = "classic"
QUORUM = "quorum"
#: Quorum work queues: deliveries without an outcome (returned by a dead worker or a lost
#: connection) before the broker dead-letters the message. The worker itself never requeues
#: for "not yet" (it republishes), so only crashes count. Explicit, so 3.x (no default) and
#: 4.x (default 20) behave alike.
DELIVERY_LIMIT = 10
#: failed_urls and expired_urls: returned on purpose (``dlq.py list``), never a poison loop.
#: Not -1: RabbitMQ 4 reads that as "no limit", 3.x as "drop on the first return".
BROWSE_DELIVERY_LIMIT = 1_000_000
#: AMQP reply code of a declaration whose arguments differ from the existing queue's.
PRECONDITION_FAILED = 406


def hold_name(level_ms: int) -> str:
    return f"hold.{level_ms}"


def worker_queues(render: bool = False, media: bool = False) -> tuple[str, ...]:
    """The queues a worker consumes, most urgent first: a render worker's, a download
    worker's (``media``) or an HTTP worker's."""
    return RENDER_QUEUES if render else MEDIA_QUEUES if media else WORK_QUEUES


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
    QueueSpec(RENDER_PRIORITY_QUEUE, {"x-message-ttl": 30 * MINUTE_MS,
                                      "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(RENDER_QUEUE, {"x-message-ttl": HOUR_MS,
                             "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(MEDIA_PRIORITY_QUEUE, {"x-message-ttl": 30 * MINUTE_MS,
                                     "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(MEDIA_QUEUE, {"x-message-ttl": HOUR_MS,
                            "x-dead-letter-exchange": EXPIRED_EXCHANGE}),
    QueueSpec(FAILED_QUEUE, {"x-message-ttl": 24 * HOUR_MS},
              bind_exchange=FAILED_EXCHANGE, bind_key=FAILED_ROUTING_KEY),
    QueueSpec(EXPIRED_QUEUE, {"x-message-ttl": 24 * HOUR_MS},
              bind_exchange=EXPIRED_EXCHANGE),
    *(QueueSpec(hold_name(level), {"x-message-ttl": level, "x-dead-letter-exchange": ""},
                bind_exchange=hold_name(level)) for level in HOLD_LEVELS_MS),
)

QUEUE_TTL_MS: dict[str, int] = {q.name: q.arguments["x-message-ttl"] for q in QUEUES}


def queue_arguments(queue: QueueSpec, queue_type: str = CLASSIC) -> dict[str, Any]:
    """The arguments ``queue`` is declared with under ``queue_type`` (see the module doc)."""
    if queue_type == CLASSIC:
        return dict(queue.arguments)
    if queue_type != QUORUM:
        raise ValueError(f"unknown queue type {queue_type!r}")
    arguments = {**queue.arguments, "x-queue-type": QUORUM}
    if "x-dead-letter-exchange" in queue.arguments:
        arguments["x-dead-letter-strategy"] = "at-least-once"
        arguments["x-overflow"] = "reject-publish"
    if queue.name in CONSUMED_QUEUES:
        arguments["x-delivery-limit"] = DELIVERY_LIMIT
    elif queue.name in (FAILED_QUEUE, EXPIRED_QUEUE):
        arguments["x-delivery-limit"] = BROWSE_DELIVERY_LIMIT
    return arguments


def declare(channel: Any, queue_type: str = CLASSIC) -> None:
    """Declare every exchange, queue and binding on ``channel`` (a pika BlockingChannel).

    Idempotent: re-declaring with the same arguments is a no-op on the broker.

    Raises:
        TopologyMismatch: a queue exists with other arguments (the channel is closed then).
    """
    for exchange in EXCHANGES:
        channel.exchange_declare(exchange=exchange.name, exchange_type=exchange.type, durable=True)
    for queue in QUEUES:
        try:
            channel.queue_declare(queue=queue.name, durable=True,
                                  arguments=queue_arguments(queue, queue_type))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != PRECONDITION_FAILED:
                raise
            raise TopologyMismatch(mismatch_help(queue.name, queue_type, exc.reply_text)) from None
        if queue.bind_exchange:
            channel.queue_bind(queue=queue.name, exchange=queue.bind_exchange,
                               routing_key=queue.bind_key)


def mismatch_help(name: str, queue_type: str, reply: str) -> str:
    """What to tell the operator when ``name`` exists with other arguments."""
    other = CLASSIC if queue_type == QUORUM else QUORUM
    return (f"RabbitMQ refused to declare queue {name!r} as QUEUE_TYPE={queue_type}: {reply}. "
            f"It exists with other arguments (declared with QUEUE_TYPE={other} or by an older "
            "version), and a queue's arguments cannot change in place. Either set QUEUE_TYPE "
            "back to what the queues are, or migrate: point the fleet at a new virtual host "
            "(RABBITMQ_VHOST or the URL's path) and let the old workers drain the old one, or "
            "stop everything, drain and delete the fleet's queues (priority_queue, "
            "url_queue_ttl, render_priority, render_queue, media_priority, media_queue, failed_urls, expired_urls, hold.*) and start again. "
            "NOTES.md #40 explains both.")


def delete_all(channel: Any) -> None:
    """Delete every queue and exchange this module declares (tests and `stats --reset`)."""
    for queue in QUEUES:
        channel.queue_delete(queue=queue.name)
    for exchange in EXCHANGES:
        channel.exchange_delete(exchange=exchange.name)
