"""Reading the fleet's record streams as a sink: one Redis consumer group per sink on
``results``, ``failures`` and ``assets`` (:data:`STREAMS`), this consumer's pending entries
replayed after a crash, an entry acknowledged only after the sink wrote it durably, and every
stream trimmed below what every registered sink has acknowledged.

A sink is registered by name in the set ``sinks`` and reads through the group
``sink:{name}`` on each stream (one XREADGROUP over all three). While any sink is registered
the workers stop MAXLEN-trimming the streams (``RECORD_LUA`` checks ``sinks`` on every append,
whichever stream it appends to: ``ResultStore.record(stream=...)``); :meth:`SinkReader.trim`
trims them instead, with MINID, never above the oldest entry some registered sink has not
acknowledged. So a sink that is registered but never runs holds the trimming: the streams grow
by its lag until it runs again or is retired (:func:`retire`: SREM and XGROUP DESTROY). A sink
registered before a stream was added gets its group on it at its next start, from id 0; until
then trimming that stream waits for it (:func:`trim_floor`).

On a Redis Cluster a stream is a part per shard (an Entry's ``stream``; ``slots.whole``): a
shard's three parts in one XREADGROUP, shard after shard; ``sinks`` in every shard too.

Exactly once in the sink rests on three things: an entry is acknowledged only after
``Sink.write`` returned (durable), so a crash leaves it pending and the next start replays it
(XREADGROUP from id 0 before ``>``); stream ids grow within a stream and one consumer reads
them in order, so a sink recognises a replayed entry by its stream and id, compared only within
its stream (files: the highest id written per stream; PostgreSQL: an upsert per table); and
only one batch (at most ``batch`` entries of each stream) is ever unacknowledged.

What a sink is (:class:`scrape_fleet.sinks.Sink`, the public interface, and :class:`Entry`)
lives in the public package; :func:`run_sink` drives anything of that shape (``name``,
``write``, ``close``, optionally ``idle``), a subclass or not.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson
import redis

from common.core.backoff import reconnect_delay_s
from common.core.errors import REDIS_UNAVAILABLE
from common.store.keys import ASSETS_STREAM, FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.slots import SHARDS, cluster, part, parts
from scrape_fleet.sinks import Entry, Sink

logger = logging.getLogger(__name__)

#: The streams every sink reads, in this order.
STREAMS = (RESULTS_STREAM, FAILURES_STREAM, ASSETS_STREAM)
#: How long one XREADGROUP waits for new entries: the longest a stop request waits.
BLOCK_MS = 1000
#: How often :func:`run_sink` trims the streams while entries flow (and on every idle second).
TRIM_EVERY_S = 1.0
POLL_S = 0.2  #: on a cluster, the pause after a round of reads that found nothing


def streams() -> list[str]:
    """Every stream a sink reads: :data:`STREAMS`, or on a cluster their parts."""
    return [name for stream in STREAMS for name in parts(stream)]

T = TypeVar("T")
StreamId = tuple[int, int]


class Stopped(Exception):
    """A stop was requested while Redis was unavailable: the caller leaves at once."""


class SinkGone(Exception):
    """The sink's consumer group no longer exists (retired, or Redis lost its data)."""


def parse_id(text: str | bytes) -> StreamId:
    """A stream id "ms-seq" as a tuple that sorts as Redis does."""
    raw = text.decode() if isinstance(text, bytes) else text
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SinkReader:
    """Reads :data:`STREAMS` for sink ``name`` as consumer ``consumer`` (one
    process per sink name: a restarted sink must use the same consumer to get its pending
    entries back), ``batch`` entries per stream at a time."""

    def __init__(self, client: redis.Redis, name: str, consumer: str | None = None,
                 batch: int = 500) -> None:
        self.client = client
        self.name = name
        self.group = sink_group(name)
        self.consumer = consumer or name
        self.batch = batch
        self._stop = threading.Event()
        self._replaying = True
        self._cursor = dict.fromkeys(streams(), "0")

    def register(self) -> None:
        """SADD the name to ``sinks`` (workers stop MAXLEN-trimming), then create the group on
        each stream from id 0 (everything still in them). Idempotent."""

        def do() -> None:
            # Read first, write only what is missing: a Redis over maxmemory refuses SADD and
            # XGROUP CREATE, and that is when an operator starts a sink to drain it.
            for sinks in dict.fromkeys([SINKS, *parts(SINKS)]):
                if not self.client.sismember(sinks, self.name):
                    self.client.sadd(sinks, self.name)
            for stream in streams():
                if self._has_group(stream):
                    continue
                try:
                    self.client.xgroup_create(stream, self.group, id="0", mkstream=True)
                except redis.ResponseError as exc:
                    if not str(exc).startswith("BUSYGROUP"):
                        raise

        self._redis("register", do)

    def _has_group(self, stream: str) -> bool:
        try:
            groups = self.client.xinfo_groups(stream)
        except redis.ResponseError:  # no such stream yet
            return False
        return any(_text(g.get("name")) == self.group for g in groups)

    def batches(self, stop: threading.Event) -> Iterator[list[Entry]]:
        """Lists of entries until ``stop`` is set: first this consumer's pending entries (the
        replay after a crash), then new ones; an empty list after a read that waited
        :data:`BLOCK_MS` for nothing. After a Redis error the pending ones come first again
        (a lost reply leaves entries delivered to us that we never saw)."""
        self._stop = stop
        while not stop.is_set():
            try:
                if self._replaying:
                    entries = self._redis("read pending", lambda: self._read(dict(self._cursor)))
                    if entries is None:
                        self._replaying = False
                    if not entries:
                        continue
                else:
                    entries = self._redis("read", lambda: self._read(
                        dict.fromkeys(streams(), ">"), BLOCK_MS)) or []
            except Stopped:
                return
            yield entries

    def _read(self, ids: dict[str, str], block_ms: int | None = None) -> list[Entry] | None:
        """One XREADGROUP over every stream; None when it returned nothing at all. On a
        cluster one per shard, none blocking."""
        if not cluster():
            return self._read_slot(ids, block_ms)
        found: list[Entry] | None = None
        for shard in range(SHARDS):
            names = [part(stream, shard) for stream in STREAMS]
            entries = self._read_slot({name: ids[name] for name in names})
            if entries is not None:
                found = [*(found or []), *entries]
        if found is None and block_ms:
            self._stop.wait(POLL_S)
        return found

    def _read_slot(self, ids: dict[str, str], block_ms: int | None = None
                   ) -> list[Entry] | None:
        try:
            reply = self.client.xreadgroup(self.group, self.consumer, ids, count=self.batch,
                                           block=block_ms)
        except redis.ResponseError as exc:
            if str(exc).startswith("NOGROUP"):
                raise SinkGone(f"consumer group {self.group} is gone (retired, or Redis lost its "
                               "data); restart the sink to register it again") from None
            raise
        pairs = reply.items() if isinstance(reply, dict) else (reply or [])
        entries: list[Entry] = []
        vanished: list[tuple[str, str]] = []
        for stream_name, items in pairs:
            stream = _text(stream_name)
            for raw_id, fields in items:
                ident = _text(raw_id)
                self._cursor[stream] = ident
                data = (fields or {}).get(b"json") or (fields or {}).get("json")
                try:
                    entries.append(Entry(stream, ident, orjson.loads(data)))
                except (TypeError, orjson.JSONDecodeError):
                    # A pending entry deleted from the stream, or no JSON record: there is
                    # nothing to write; acknowledge it so it does not hold the trimming.
                    logger.error("%s entry %s has no JSON record (%s); acknowledged unwritten",
                                 stream, ident, "deleted" if not fields else "undecodable")
                    vanished.append((stream, ident))
        if vanished:
            self._xack(vanished)
        return entries if any(items for _s, items in pairs) else None

    def ack(self, entries: list[Entry]) -> None:
        """XACK the entries on their streams, retried until Redis answers (or stop: then
        :class:`Stopped`, and they are replayed at the next start)."""
        self._redis("ack", lambda: self._xack([(e.stream, e.id) for e in entries]))

    def _xack(self, pairs: list[tuple[str, str]]) -> None:
        by_stream: dict[str, list[str]] = {}
        for stream, ident in pairs:
            by_stream.setdefault(stream, []).append(ident)
        pipe = self.client.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.group, *ids)
        pipe.execute()

    def trim(self) -> dict[str, str | None]:
        """XTRIM each stream with MINID at the oldest entry that some registered sink has not
        acknowledged; returns that id per stream (None: not trimmed)."""
        return self._redis("trim", lambda: {s: self._trim(s) for s in streams()})

    def _trim(self, stream: str) -> str | None:
        try:
            floor = trim_floor(self.client, stream)
        except redis.ResponseError as exc:  # a group destroyed meanwhile (retire): next time
            logger.warning("sink %s: not trimming %s now: %s", self.name, stream, exc)
            return None
        if floor is None:
            return None
        minid = f"{floor[0]}-{floor[1]}"
        self.client.xtrim(stream, minid=minid, approximate=False)
        return minid

    def _redis(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried with the reconnect policy while Redis is unavailable."""
        attempt = 0
        while True:
            try:
                return call()
            except (*REDIS_UNAVAILABLE, redis.exceptions.OutOfMemoryError) as exc:
                attempt += 1
                self._replaying, self._cursor = True, dict.fromkeys(streams(), "0")
                delay = reconnect_delay_s(attempt)
                logger.warning("sink %s: %s failed, Redis unavailable or full (%s); retry in "
                               "%.1f s",
                               self.name, what, exc, delay)
                if self._stop.wait(delay):
                    raise Stopped(what) from None


def _group_floor(client: redis.Redis, stream: str, info: dict[str, Any]) -> StreamId:
    """The oldest id this group has not acknowledged: its smallest pending id, else the id
    right after the last one delivered to it."""
    if int(info.get("pending") or 0) > 0:
        smallest = client.xpending(stream, info["name"]).get("min")
        if smallest is not None:
            return parse_id(smallest)
    ms, seq = parse_id(info["last-delivered-id"])
    return ms, seq + 1


def trim_floor(client: redis.Redis, stream: str) -> StreamId | None:
    """The MINID below which every registered sink has acknowledged ``stream``; None when no
    sink is registered (MAXLEN caps the stream), the stream is missing, or a registered sink
    has no group on it yet (it may still read everything)."""
    names = sorted(_text(n) for n in client.smembers(SINKS))
    if not names:
        return None
    try:
        groups = {_text(g["name"]): g for g in client.xinfo_groups(stream)}
    except redis.ResponseError:
        return None
    floors = []
    for name in names:
        info = groups.get(sink_group(name))
        if info is None:
            return None
        floors.append(_group_floor(client, stream, info))
    return min(floors)


def retire(client: redis.Redis, name: str) -> bool:
    """Unregister sink ``name``: SREM from ``sinks`` (it no longer holds the trimming) and
    XGROUP DESTROY its group on every stream. Returns False when there was nothing to retire.
    Stop the sink's process first, or its next read fails (:class:`SinkGone`)."""
    found = bool(client.srem(SINKS, name))
    for sinks in parts(SINKS) if cluster() else []:
        client.srem(sinks, name)
    for stream in streams():
        try:
            found = bool(client.xgroup_destroy(stream, sink_group(name))) or found
        except redis.ResponseError:
            pass  # no such stream
    return found


def _write(sink: Sink, batch: list[Entry], stop: threading.Event) -> bool:
    """``sink.write(batch)``, retried with the reconnect policy until it succeeds (True) or
    ``stop`` is set (False): a failed write leaves nothing, and nothing is acknowledged."""
    attempt = 0
    while True:
        try:
            sink.write(batch)
            return True
        except Exception as exc:
            attempt += 1
            delay = reconnect_delay_s(attempt)
            logger.error("sink %s: writing %d entries failed (%s: %s); retry in %.1f s",
                         sink.name, len(batch), type(exc).__name__, exc, delay,
                         exc_info=attempt == 1)
            if stop.wait(delay):
                return False


def run_sink(reader: SinkReader, sink: Sink, stop: threading.Event, *,
             idle_exit_s: float = 0.0, trim_every_s: float = TRIM_EVERY_S) -> int:
    """Register, then batch → ``sink.write`` → ack until ``stop`` (or ``idle_exit_s`` with
    nothing new), trimming the streams every ``trim_every_s`` and when idle. A failed write or
    an unreachable Redis is retried (nothing acknowledged meanwhile). Returns the exit code:
    0, or 1 when stopped while a write kept failing or when the group vanished.
    ``sink.close()`` is called only when everything written was acknowledged."""
    written = 0
    last_trim = idle_since = time.monotonic()
    try:
        reader.register()
        logger.info("sink %s registered (group %s, consumer %s)", sink.name, reader.group,
                    reader.consumer)
        for batch in reader.batches(stop):
            now = time.monotonic()
            if batch:
                if not _write(sink, batch, stop):
                    logger.warning("sink %s stopped with a batch unwritten; it is replayed at "
                                   "the next start", sink.name)
                    return 1
                reader.ack(batch)
                written += len(batch)
                idle_since = now
            else:
                idle = getattr(sink, "idle", None)
                if idle is not None:
                    idle()
            if not batch or now - last_trim >= trim_every_s:
                reader.trim()
                last_trim = now
            if not batch and idle_exit_s and now - idle_since >= idle_exit_s:
                logger.info("sink %s: idle for %.1f s, exiting", sink.name, idle_exit_s)
                break
    except Stopped as exc:
        logger.warning("sink %s stopped while Redis was unavailable (%s); unacknowledged "
                       "entries are replayed at the next start", sink.name, exc)
        return 0
    except SinkGone as exc:
        logger.error("sink %s: %s", sink.name, exc)
        return 1
    sink.close()
    logger.info("sink %s: %d entries written and acknowledged", sink.name, written)
    return 0
