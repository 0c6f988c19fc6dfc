"""The ack ledger of one AMQP channel: which deliveries are in flight, which wait for publisher
confirms, and which acks the I/O loop still owes the broker.

A delivery is acked only once its outcome is durable: at once when the result is already in
Redis, or once every message its outcome published (a hold-queue hop, a dead letter) is
confirmed. A failed confirm nacks it back to its queue. The ledger lives on the I/O thread
(pika is not thread-safe) and is cleared with each new channel: delivery tags of an old channel
are void, and the broker redelivers whatever that channel left unacked.

A delivery the worker cannot take now (Redis away or refusing, a stopping worker's unstarted
deliveries) is given back by :meth:`AckLedger.give_back`: a confirmed copy to the tail of its
queue, then an ack, never ``basic.nack(requeue=True)``. A quorum queue counts every requeue
toward its delivery limit on RabbitMQ 4.0-4.2 (and ``basic.reject`` on every 4.x), so a
"not yet" requeue loop would dead-letter good URLs; a copy starts with no deliveries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.broker.publisher import Confirm, ConfirmingPublisher
from common.store.marks import DoneMark

Record = dict[str, Any]


@dataclass
class Delivery:
    """One message received from a work queue, as a fetch task gets it."""

    tag: int
    queue: str
    body: bytes
    generation: int  # the worker's channel generation it arrived on
    early_acked: bool  # acked on receipt (PRIORITY_AUTO_ACK)
    received_at: float
    expiration_ms: int | None = None  # its per-message TTL, kept when it is given back
    redelivered: bool = False  # handed out before without an outcome (common/work/poison.py)
    death: str | None = None  # an expired_urls message's x-death reason (expired, delivery_limit)


def expiration_of(properties: Any) -> int | None:
    """A delivery's per-message TTL in ms (AMQP ``expiration``), if it has one."""
    raw = getattr(properties, "expiration", None)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def death_of(properties: Any) -> str | None:
    """Why a dead-lettered message left its queue: the first x-death entry's ``reason``."""
    deaths = (getattr(properties, "headers", None) or {}).get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        reason = deaths[0].get("reason")
        if isinstance(reason, bytes):
            reason = reason.decode("ascii", "replace")
        return reason if isinstance(reason, str) else None
    return None


class AckLedger:
    """Acks, nacks and confirm bookkeeping for the current channel.

    Args:
        confirmed: called with a delivery's done mark and failure record once every publish
            of its outcome is confirmed (dead letters), before the delivery is acked.
    """

    def __init__(self, confirmed: Callable[[DoneMark | None, Record | None], None]) -> None:
        self.inflight: dict[int, Delivery] = {}
        self._confirmed = confirmed
        self._channel: Any = None  # pika's asynchronous channel under the BlockingChannel
        self._publisher: ConfirmingPublisher | None = None  # for give_back
        self._acks: list[int] = []  # settled with an ack, not yet handed to the channel
        self._awaiting: dict[int, list[bool]] = {}  # tag -> confirm results so far
        self._marks: dict[int, tuple[DoneMark | None, Record | None]] = {}

    def reset(self, channel: Any, publisher: ConfirmingPublisher | None = None) -> None:
        """Start over on a new channel (the old one's tags are void)."""
        self._channel = channel
        self._publisher = publisher
        self.inflight.clear()
        self._acks.clear()
        self._awaiting.clear()
        self._marks.clear()

    @property
    def unsettled(self) -> bool:
        """Deliveries still in flight or publishes still waiting for their confirm."""
        return bool(self.inflight or self._awaiting)

    def received(self, delivery: Delivery) -> None:
        if not delivery.early_acked:
            self.inflight[delivery.tag] = delivery

    def expect_confirms(self, tag: int, mark: DoneMark | None,
                        record: Record | None = None) -> None:
        """The outcome of delivery ``tag`` is being published: settle it on the confirms."""
        self._awaiting[tag] = []
        self._marks[tag] = (mark, record)

    def settle(self, confirms: Iterable[Confirm]) -> list[int]:
        """Take publisher confirms (token ``(tag, expected)``); ack each delivery whose every
        publish is confirmed, nack it when one failed. Returns the nacked tags."""
        nacked = []
        for confirm in confirms:
            tag, expected = confirm.token
            results = self._awaiting.get(tag)
            if results is None:
                continue
            results.append(confirm.ok)
            if len(results) < expected:
                continue
            del self._awaiting[tag]
            mark, record = self._marks.pop(tag, (None, None))
            if all(results) and (mark is not None or record is not None):
                self._confirmed(mark, record)
            if tag not in self.inflight:
                continue  # an early-acked delivery: nothing left to settle
            if all(results):
                self.ack(tag)
            else:
                self.nack(tag)
                nacked.append(tag)
        return nacked

    def ack(self, tag: int) -> None:
        self.inflight.pop(tag, None)
        self._acks.append(tag)  # sent by flush() at the end of this loop turn

    def nack(self, tag: int) -> None:
        """Return delivery ``tag`` to its queue at once (a requeue: counts toward a quorum
        queue's delivery limit; only for a publish that failed, see :meth:`give_back`)."""
        self.inflight.pop(tag, None)
        self._channel.basic_nack(tag, requeue=True)

    def give_back(self, delivery: Delivery) -> None:
        """Return ``delivery`` to its queue without a requeue: publish a copy to the tail of
        the queue (default exchange, confirmed) and ack the original once the copy is
        confirmed; a copy that fails falls back to :meth:`nack`. An early-acked delivery
        (PRIORITY_AUTO_ACK) gets its copy too, rather than being lost."""
        if self._publisher is None:
            if not delivery.early_acked:
                self.nack(delivery.tag)
            return
        self.expect_confirms(delivery.tag, None)
        self._publisher.publish("", delivery.queue, delivery.body, token=(delivery.tag, 1),
                                expiration_ms=delivery.expiration_ms)

    def flush(self) -> None:
        """Hand this loop turn's acks to the channel, as few frames as is safe.

        Tags are per channel and increase with every delivery, so one ack with
        ``multiple=True`` settles every outstanding tag up to it; that is safe below the
        lowest tag still in flight (early-acked and nacked tags are no longer outstanding).
        Acks above it go one by one, never held back: an ack waiting for a slow fetch would
        shrink the prefetch window. The asynchronous channel queues the frames and the loop's
        next ``process_data_events`` writes them; BlockingChannel.basic_ack would flush the
        socket for every single ack (NOTES.md #24, #26).
        """
        if not self._acks:
            return
        floor = min(self.inflight) if self.inflight else None
        below = [tag for tag in self._acks if floor is None or tag < floor]
        if below:
            self._channel.basic_ack(max(below), multiple=len(below) > 1)
        if len(below) < len(self._acks):
            for tag in self._acks:
                if floor is not None and tag > floor:
                    self._channel.basic_ack(tag)
        self._acks.clear()
