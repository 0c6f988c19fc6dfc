"""Persistent publishing with asynchronous publisher confirms on a pika BlockingConnection.

pika's ``BlockingChannel.confirm_delivery()`` makes every ``basic_publish`` wait for its own
confirm: one round trip per message (about 700 msg/s here, NOTES.md #5). We instead switch the
underlying channel (``BlockingChannel._impl``, the documented asynchronous ``Channel``) to
confirm mode with an ack/nack callback, publish without waiting, and collect confirms whenever
the connection processes events. Each publish carries a caller ``token``; :meth:`poll` and
:meth:`wait` hand back ``Confirm(token, ok, reason)`` so the caller decides what a failed publish
means (the producer un-marks the URL as seen; the worker does not ack the original delivery).

Unroutable messages (``mandatory=True`` and no queue bound) are returned by the broker before
their ack; we remember their ``message_id`` and report them as failed.

Not thread-safe, like everything pika: call it from the connection's own thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pika
import pika.spec

from common.core.errors import PublishError

PERSISTENT = pika.DeliveryMode.Persistent


@dataclass(frozen=True)
class Confirm:
    token: Any
    ok: bool
    reason: str | None = None


class ConfirmingPublisher:
    """Publishes on its own channel of ``connection`` and tracks confirms asynchronously."""

    def __init__(self, connection: pika.BlockingConnection, confirm_timeout_s: float = 30.0):
        self.connection = connection
        self.channel = connection.channel()
        self.confirm_timeout_s = confirm_timeout_s
        self._seq = 0
        self._pending: OrderedDict[int, Any] = OrderedDict()
        self._returned: set[str] = set()
        self._done: list[Confirm] = []
        selected: list[bool] = []
        self.channel._impl.add_on_return_callback(self._on_return)
        self.channel._impl.confirm_delivery(ack_nack_callback=self._on_ack_nack,
                                            callback=lambda _frame: selected.append(True))
        deadline = time.monotonic() + confirm_timeout_s
        while not selected:
            if time.monotonic() > deadline:
                raise PublishError("broker did not confirm Confirm.Select")
            self.connection.process_data_events(time_limit=0.1)

    @property
    def pending(self) -> int:
        """Publishes still waiting for their confirm."""
        return len(self._pending)

    def publish(self, exchange: str, routing_key: str, body: bytes, *, token: Any,
                expiration_ms: int | None = None, headers: dict[str, Any] | None = None,
                mandatory: bool = True) -> None:
        """Publish a persistent JSON message; its confirm arrives later via poll()/wait()."""
        self._seq += 1
        props = pika.BasicProperties(
            content_type="application/json", delivery_mode=PERSISTENT,
            message_id=str(self._seq), timestamp=int(time.time()),
            expiration=None if expiration_ms is None else str(int(expiration_ms)),
            headers=headers or None)
        self._pending[self._seq] = token
        # Queue the frames on the asynchronous channel; they are written by the next event
        # processing (poll/wait), so a batch costs one write, not one per message.
        self.channel._impl.basic_publish(exchange=exchange, routing_key=routing_key, body=body,
                                         properties=props, mandatory=mandatory)

    def poll(self, time_limit_s: float = 0.0) -> list[Confirm]:
        """Process connection events for up to ``time_limit_s``; return the confirms received."""
        self.connection.process_data_events(time_limit=time_limit_s)
        return self.take()

    def take(self) -> list[Confirm]:
        """Confirms received so far (by any event processing on this connection)."""
        done, self._done = self._done, []
        return done

    def wait(self, timeout_s: float | None = None) -> list[Confirm]:
        """Wait until every pending publish is confirmed; return all confirms received.

        Publishes still unconfirmed at the deadline are reported as failed (``timeout``): the
        broker may still have them, so callers must treat them as *maybe* published.
        """
        deadline = time.monotonic() + (self.confirm_timeout_s if timeout_s is None else timeout_s)
        while self._pending and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.05)
        if self._pending:
            self._fail_pending("confirm timeout")
        return self.take()

    def fail_all(self, reason: str) -> list[Confirm]:
        """Give up on every pending publish (the channel or connection is gone)."""
        self._fail_pending(reason)
        return self.take()

    def _fail_pending(self, reason: str) -> None:
        for token in self._pending.values():
            self._done.append(Confirm(token, False, reason))
        self._pending.clear()

    # pika callbacks: they run inside the connection's event processing.
    def _on_return(self, _channel: Any, _method: Any, properties: Any, _body: bytes) -> None:
        if properties.message_id:
            self._returned.add(properties.message_id)

    def _on_ack_nack(self, frame: Any) -> None:
        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        tags = [method.delivery_tag]
        if method.multiple:
            # _pending is in publish order, so the acknowledged ones are a prefix of it.
            tags = []
            for seq in self._pending:
                if seq > method.delivery_tag:
                    break
                tags.append(seq)
        for seq in tags:
            token = self._pending.pop(seq, None)
            if token is None:
                continue
            if not ok:
                self._done.append(Confirm(token, False, "nacked by broker"))
            elif str(seq) in self._returned:
                self._returned.discard(str(seq))
                self._done.append(Confirm(token, False, "unroutable"))
            else:
                self._done.append(Confirm(token, True))
