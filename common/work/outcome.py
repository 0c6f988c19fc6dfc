"""Outcomes: what the I/O thread must publish, durably, before it may ack a delivery.

A fetch task decides an :class:`Outcome` for each delivery; the I/O thread carries it out
(common/work/worker.py) and acks once it is durable:

* ``result``        the result is already in Redis: ack;
* ``delay``         publish the message to a hold queue (rate limit, backoff, robots busy): ack
                    once confirmed. Delayed, never dropped, never busy-waited;
* ``dead_letter``   publish to ``failed_urls`` with headers (common/broker/deadletter.py): ack
                    once confirmed;
* ``released``      an expired message whose fingerprint was released: ack;
* ``already_done``  a redelivery of a URL whose outcome is recorded: ack, nothing else;
* ``paused``        a paused job's message, stored in ``job:{name}:parked`` (resumed from
                    there): ack, nothing published;
* ``cancelled``     a message of a job's run that is no longer running (cancelled, finished,
                    deleted, an older run), its outcome counted: ack, nothing else;
* ``render``        a page that needs a browser, published to the render queue twin of its
                    queue (common/work/render_route.py): ack once confirmed.

A step of the worker's journey (common/work/steps/) that ends a delivery without a result
returns an :data:`Ending` instead (:class:`Park`, :class:`Retry`, :class:`DeadLetter`): what
should become of it, not how. One place turns it into the outcome
(:meth:`common.work.giving_up.GivingUp.settle`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from common.broker import topology
from common.broker.deadletter import DLQ_EXCHANGE, DLQ_ROUTING_KEY
from common.broker.messages import WorkMessage
from common.core.redact import LOG_VALUE_MAX_CHARS, clip
from common.store.marks import DoneMark, Retime

OutcomeKind = Literal["result", "delay", "dead_letter", "released", "already_done", "paused",
                      "cancelled", "render"]


@dataclass(frozen=True)
class Publish:
    """A message the I/O thread must publish (with confirm) before acking the delivery."""

    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any] | None = None
    expiration_ms: int | None = None


@dataclass(frozen=True)
class Outcome:
    """``url`` (as received, or canonical) and ``detail`` are for the log line, each cut to
    LOG_VALUE_MAX_CHARS with a ``…[+N chars]`` marker."""

    kind: OutcomeKind
    url: str
    publishes: tuple[Publish, ...] = field(default=())
    detail: str = ""
    #: The URL's done mark, set once the publishes are confirmed (dead letters), so a
    #: redelivery of the same message does not dead-letter the URL twice.
    mark_done: DoneMark | None = None
    #: The failure record appended to ``results`` once the publishes are confirmed (dead
    #: letters), so the URL's final outcome reaches the result sinks.
    record: dict[str, Any] | None = None
    #: The job run of the delivery ("name/run"; empty: the default job), for the metrics and
    #: the log line.
    job: str = ""

    def __post_init__(self) -> None:
        # ``url`` and ``detail`` are what the worker logs; a message may carry a 5 MB URL.
        if len(self.url) > LOG_VALUE_MAX_CHARS:
            object.__setattr__(self, "url", clip(self.url))
        if len(self.detail) > LOG_VALUE_MAX_CHARS:
            object.__setattr__(self, "detail", clip(self.detail))


@dataclass(frozen=True)
class Failure:
    """A failed attempt: what to put in the dead-letter headers and how to retry."""

    reason: str
    status: int | None = None
    error: str | None = None
    retry_after: str | None = None


@dataclass(frozen=True, slots=True)
class Park:
    """Wait ``delay_ms`` on the hold queues, then come back (a rate-limit turn, robots.txt
    being fetched, a ``not_before`` not reached); ``message``: the one to park, if not the
    delivery's own (a booked slot added)."""

    delay_ms: float
    why: str
    message: WorkMessage | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A transient failure: counted, then retried with backoff, or dead-lettered
    ``max_retries`` past MAX_RETRIES. ``retime``: the permit of the request that failed."""

    failure: Failure
    retime: Retime | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A permanent failure: published to ``failed_urls`` with its failure record.
    ``unless_done``: a redelivery whose outcome is recorded is ``already_done`` instead (not
    dead-lettered twice); ``count``: a ``stats:counters`` field to add one to with it."""

    failure: Failure
    retime: Retime | None = None
    unless_done: bool = False
    count: str | None = None


#: How a step ends a delivery that has no result.
Ending = Park | Retry | DeadLetter


def park(message: WorkMessage, queue: str, delay_ms: float, why: str, *,
         turn: bool = True) -> Outcome:
    """Send ``message`` to the hold queue for the next hop of ``delay_ms``; it comes back to
    ``queue`` then, and waits out the rest of the delay (``not_before``) hop by hop.

    The message keeps the time it began waiting for its turn (``parked_at``) until it gets
    it (the processor drops it then): MAX_WAIT_S is counted from there (:func:`wait_left_ms`).
    ``turn=False`` is a wait that is not for a turn (a retry's backoff): it starts counting
    once the delay is over."""
    level = topology.hold_level(delay_ms) or topology.HOLD_LEVELS_MS[0]
    now = time.time()
    not_before = now + delay_ms / 1000
    current = message.extra.get("not_before")
    if isinstance(current, int | float) and current > not_before:
        not_before = current
    parked_at = message.extra.get("parked_at")
    if not isinstance(parked_at, int | float):
        parked_at = round(now if turn else not_before, 3)
    parked = replace(message, extra={**message.extra, "not_before": round(not_before, 3),
                                     "parked_at": parked_at})
    publish = Publish(topology.hold_name(level), queue, parked.to_json())
    return Outcome("delay", message.url, (publish,),
                   detail=f"{why}: held {level} ms of {delay_ms:.0f} ms")


def to_render(message: WorkMessage, queue: str, render: Any, why: str,
              expiration_ms: int | None = None) -> Outcome:
    """Send ``message`` on to ``queue``'s render twin, its ``render`` field set (true or the
    options); its per-message TTL (a routing rule's) goes with it."""
    sent = replace(message, extra={**message.extra, "render": render})
    publish = Publish("", topology.RENDER_TWIN[queue], sent.to_json(),
                      expiration_ms=expiration_ms)
    return Outcome("render", message.url, (publish,), detail=why)


def dead_letter(url: str, body: bytes, headers: dict[str, Any], detail: str,
                record: dict[str, Any], mark_done: DoneMark | None = None) -> Outcome:
    """Publish ``body`` to ``failed_urls`` with its dead-letter ``headers``; once confirmed,
    ``record`` (the failure record) is appended to the results."""
    return Outcome("dead_letter", url, (Publish(DLQ_EXCHANGE, DLQ_ROUTING_KEY, body,
                                                headers=headers),),
                   detail=detail, mark_done=mark_done, record=record)


def wait_left_ms(message: WorkMessage, max_wait_s: float, *,
                 ahead_max_s: float | None = None) -> int:
    """How much longer (ms) ``message`` may wait for its turn: MAX_WAIT_S from when it was
    first parked, or from now if it never was; -1 when MAX_WAIT_S is 0 (no limit).

    A ``parked_at`` in the future is a retry's backoff (MAX_WAIT_S counts after it);
    ``ahead_max_s`` bounds how far ahead it may be, so a message claiming to be parked in a
    far future cannot wait without end."""
    if max_wait_s <= 0:
        return -1
    parked_at = message.extra.get("parked_at")
    now = time.time()
    if isinstance(parked_at, int | float):
        if ahead_max_s is not None:
            parked_at = min(parked_at, now + ahead_max_s)
        waited_s = now - parked_at
    else:
        waited_s = 0.0
    return max(0, round((max_wait_s - waited_s) * 1000))


def not_before_too_late(message: WorkMessage, remaining_ms: float, max_wait_s: float,
                        backoff_max_s: float) -> Failure | None:
    """The ``waited_too_long`` failure when ``message``'s ``not_before`` (``remaining_ms``
    away) lies beyond its wait limit (:func:`wait_left_ms`, with a future ``parked_at`` at most
    ``backoff_max_s`` ahead: the longest retry delay), else None. Every wait is bounded: a
    ``not_before`` of 1e300 is a dead letter, not a 55-minute hop forever. None when
    MAX_WAIT_S is 0 (no limit). One second of slack covers the rounding of both times."""
    left_ms = wait_left_ms(message, max_wait_s, ahead_max_s=backoff_max_s)
    if left_ms < 0 or remaining_ms <= left_ms + 1000:
        return None
    return _too_late(message, remaining_ms)


def waited_too_long(message: WorkMessage, admission: Any) -> Failure:
    """The dead-letter failure of a URL whose turn (``admission.wait_ms`` away) would come
    after MAX_WAIT_S."""
    return _too_late(message, admission.wait_ms)


def _too_late(message: WorkMessage, wait_ms: float) -> Failure:
    parked_at = message.extra.get("parked_at")
    try:
        since = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(parked_at))
                 if isinstance(parked_at, int | float) else "never parked")
    except (OverflowError, OSError, ValueError):  # a parked_at no calendar holds
        since = f"{parked_at:.6g} (not a date)"
    wait_s = wait_ms / 1000
    shown = f"{wait_s:.0f}" if wait_s < 1e12 else f"{wait_s:.3g}"  # 1e300 is not 301 digits
    return Failure("waited_too_long", error=f"parked since {since}; its turn would come in "
                                            f"{shown} s")
