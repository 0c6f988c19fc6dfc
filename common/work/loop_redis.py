"""The worker's Redis client can wait for its replies through the fetch loop.

A Redis call made by a fetch loop's task would otherwise hold the whole loop for its round trip
(send, Redis runs the script, reply), the loop's CPU idle meanwhile. :class:`LoopParser` is
redis-py's hiredis reply parser with one change: before a blocking read of the socket it calls
:func:`common.web.multi.wait_readable`, which switches to the loop's other tasks until the
reply is there, but only inside :func:`common.web.multi.yielding`: the processor's admit and
result scripts (common/work/steps/admit.py and record.py). Every other call (a producer's publish-and-confirm,
robots.txt's bookkeeping, the heartbeat, pressure and releaser threads) reads as before, so
code that keeps state across a Redis call is never interleaved. Nothing else changes: one
connection per call from the pool, the same timeouts (a reply that never comes still ends in
the socket's timeout), the same errors; redis-py's pool lock is released once a connection is
taken (NOTES #26).

Used only when redis-py parses with hiredis (a dependency of the fleet); the pure-Python
parsers read through another path and keep blocking the loop.
"""

from __future__ import annotations

from typing import Any

from redis._parsers.hiredis import _HiredisParser
from redis.connection import DefaultParser
from redis.utils import SENTINEL

from common.core.config import Settings
from common.store.connection import FleetRedis, connect_redis
from common.web import multi


class LoopParser(_HiredisParser):
    """hiredis replies, waited for through the fetch loop (see the module docstring)."""

    def read_from_socket(self, timeout: Any = SENTINEL, raise_on_timeout: bool = True) -> bool:
        if timeout is SENTINEL:  # a blocking read: the reply is awaited
            sock = self._sock
            if sock is not None:
                multi.wait_readable(sock)
            return super().read_from_socket(raise_on_timeout=raise_on_timeout)
        return super().read_from_socket(timeout, raise_on_timeout)


def loop_client_options() -> dict[str, Any]:
    """The ``connect_redis`` keyword arguments of a worker's client."""
    return {"parser_class": LoopParser} if DefaultParser is _HiredisParser else {}


def worker_client(settings: Settings) -> FleetRedis:
    """A worker's Redis client: ``connect_redis``'s, its replies read through the loop."""
    return connect_redis(settings, **loop_client_options())
