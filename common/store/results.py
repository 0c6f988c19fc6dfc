"""Results: one JSON record per URL, appended to the Redis stream ``results``.

Record fields: url, final_url, status, title, description, canonical, language, links,
links_count, links_truncated, text_length, content_hash, encoding, content_type, bytes,
truncated, skipped, redirects, followed, fetched_at, elapsed_ms, worker, queue, depth, attempts,
cached, error; when something was cut: ``<field>_truncated``, links_kept, record_truncated
(caps: common/work/record.py). A dead-lettered URL leaves a failure
record in the stream ``failures`` instead (``"outcome": "dead_letter"``, reason, attempts,
last_status, last_error, first_failure), appended once its dead letter is confirmed, so every
URL's final outcome is in one of the two streams. A job's records carry ``job`` and ``run``
(the default job's neither), and the script that appends one counts it in the run's counters
(``job:{name}:run:{n}``: results and bytes, or failed and failed:{reason}) only when it was
appended: once per URL, in the same round trip. With no result sink registered (``sinks``)
both are capped with an approximate MAXLEN (``RESULTS_MAXLEN``) so they cannot grow without
bound; with sinks, the sinks trim them below what every sink has acknowledged. Readers use
XRANGE / XREAD from an id.

With REDIS_MIN_REPLICAS > 0 (carried by the client, :class:`~common.store.connection.FleetRedis`)
a result counts as recorded only once that many replicas have it: ``WAIT`` is pipelined behind
the script (the same one round trip, plus the replicas' confirmation). When they are late the
call waits again (a counter write, then WAIT, so any connection's WAIT covers the result) for up
to REDIS_WAIT_MAX_S, and the delivery stays unacked meanwhile: a second pass would find the done
mark this script set and ack on it, unconfirmed. A primary that loses its replicas because
another was promoted (a split brain) is demoted by Sentinel, which closes our connection: the
error ends the wait, and the page is done again on the new primary, where that done mark never
arrived. Past REDIS_WAIT_MAX_S, :class:`~common.core.errors.ReplicaTimeout` (a Redis outage to
the caller). A failure record (written on the worker's I/O thread) gets one WAIT only.

On a Redis Cluster (common/store/slots.py) each of the script's keys is in the URL's domain
shard: the stream, counters and sinks keys are that shard's parts (``results:{s3.54}``), and
WAIT goes down the same connection to the shard's primary (a node client's pipeline).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import orjson
import redis

from common.core.errors import ReplicaTimeout
from common.store.connection import FleetRedis, FleetRedisCluster
from common.store.hot_script import HotScript
from common.store.keys import (
    ASSETS_STREAM,
    COUNTERS,
    FAILURES_STREAM,
    RESULTS_STREAM,
    SINKS,
    content_key,
    failures_key,
    job_run_key,
)
from common.store.marks import DoneMark, Retime
from common.store.slots import (
    GIVEN_LUA,
    absent,
    part,
    parts,
    refuse_on_cluster,
    url_shard,
)

logger = logging.getLogger(__name__)
#: The counter each repeated WAIT bumps: a write of this connection for WAIT to count.
REPLICA_WAITS = "replica_waits"

# One script, one round trip, for everything a fetched page leaves in Redis.
# Absent keys ('' or on a cluster the bare hash tag, common/store/slots.py: given(key)).
# KEYS[1] done:{b} ('' = no once-only check)  KEYS[2] results (or failures)  KEYS[3] content:{url}
# KEYS[4] stats:counters  KEYS[5] failures:{url}  KEYS[6] ratelimit:{domain} ('' = no permit)
# KEYS[7] sinks (the registered result sinks: with any, the sinks trim the stream, not MAXLEN)
# KEYS[8] job:{name}:run:{n} (the record's run counters; '' = the default job)
# ARGV[1] done member  ARGV[2] record JSON  ARGV[3] results maxlen
# ARGV[4] cache value ('' = do not cache)  ARGV[5] cache TTL s  ARGV[6] clear failures (0/1)
# ARGV[7] permit member  ARGV[8] send time ms  ARGV[9] run counter (results|failed)
# ARGV[10] its bytes  ARGV[11] failure reason ('' = none)  ARGV[12..] counter name, amount, ...
# Appends the result only if the URL was not done yet; returns 1 when appended. The run's
# counters move only then: one outcome per URL, however often it is recorded.
RECORD_LUA = GIVEN_LUA + """
local appended = 1
if given(KEYS[1]) and redis.call('SADD', KEYS[1], ARGV[1]) == 0 then
  appended = 0
else
  if redis.call('SCARD', KEYS[7]) == 0 then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'json', ARGV[2])
  else
    redis.call('XADD', KEYS[2], '*', 'json', ARGV[2])
  end
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5]) end
if ARGV[6] == '1' then redis.call('DEL', KEYS[5]) end
if given(KEYS[6]) then redis.call('ZADD', KEYS[6], 'XX', 'GT', ARGV[8], ARGV[7]) end
if appended == 1 and given(KEYS[8]) then
  redis.call('HINCRBY', KEYS[8], ARGV[9], 1)
  if ARGV[10] ~= '0' then redis.call('HINCRBY', KEYS[8], 'bytes', ARGV[10]) end
  if ARGV[11] ~= '' then redis.call('HINCRBY', KEYS[8], 'failed:' .. ARGV[11], 1) end
end
for i = 12, #ARGV, 2 do redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
return appended
"""


class ResultStore:
    def __init__(self, client: redis.Redis, maxlen: int) -> None:
        self.client = client
        self.maxlen = maxlen
        self._record = HotScript(client, RECORD_LUA)
        rule = client if isinstance(client, FleetRedis | FleetRedisCluster) else FleetRedis
        self.min_replicas, self.wait_timeout_ms = rule.min_replicas, rule.wait_timeout_ms
        self.wait_max_s = rule.wait_max_s

    def record(self, record: dict[str, Any], *, cache: tuple[bytes, int] | None = None,
               counters: dict[str, int] | None = None, clear_failures: bool = False,
               done: DoneMark | None = None, retime: Retime | None = None,
               stream: str = RESULTS_STREAM) -> bool:
        """Append one result and do the URL's other bookkeeping in the same round trip (one
        script): store the response in the cache (value, ttl_s), bump counters, clear the
        URL's retry counter after a success, and move the rate-limit permit to the request's
        send time (see :func:`common.web.ratelimit.retime_permit`). With ``done`` (the URL's
        done mark) the result is appended only if the URL has no recorded outcome yet: one result
        per URL even when a delivery is processed twice.

        ``stream`` is ``results``, or ``failures`` for a dead-lettered URL's failure record
        (:meth:`record_failure`).

        Returns:
            False when ``done`` showed the URL already had its result (nothing appended).

        Raises:
            ReplicaTimeout: REDIS_MIN_REPLICAS replicas did not confirm within
                REDIS_WAIT_MAX_S (one WAIT for a failure record; module doc).
        """
        permit, sent_at = retime or (None, None)
        if sent_at is None:
            permit = None
        url = record["url"]
        keys = record_keys(url, stream, done, permit.log_key if permit else None,
                           _run_key(record))
        args: list[Any] = [done.member if done else 0, encode(record), self.maxlen,
                           cache[0] if cache else b"", cache[1] if cache else 0,
                           1 if clear_failures else 0, permit.member if permit else "",
                           int(sent_at * 1000) if permit else 0, *_run_counts(record, stream)]
        for name, amount in (counters or {}).items():
            args += (name, amount)
        if self.min_replicas:
            return self._record_replicated(url, keys, args,
                                           patient=stream != FAILURES_STREAM)
        # EVALSHA, and the script loaded after a NoScriptError (a restarted Redis, a promoted
        # replica); nothing ran then, so running it again is safe (common/store/hot_script.py).
        return bool(self._record(keys, args))

    def _record_replicated(self, url: str, keys: list[str], args: list[Any], *,
                           patient: bool) -> bool:
        """The script and ``WAIT min_replicas timeout`` in one pipeline on one connection
        (WAIT counts that connection's writes). Not through the Script object: in a pipeline
        it would ask SCRIPT EXISTS first, a round trip on every call. ``patient``: wait again
        for late replicas (:meth:`_confirm`), else raise at once.

        Raises:
            ReplicaTimeout: fewer replicas confirmed in time.
        """
        for _attempt in range(2):  # the second after loading the script (NOSCRIPT)
            pipe = self._pipeline(keys[1])
            pipe.evalsha(self._record.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.min_replicas, self.wait_timeout_ms)
            appended, confirmed = pipe.execute(raise_on_error=False)
            if isinstance(appended, redis.exceptions.NoScriptError):
                self._pipeline(keys[1]).script_load(RECORD_LUA).execute()
                continue
            for reply in (appended, confirmed):
                if isinstance(reply, Exception):
                    self._lost_node(reply)
                    raise reply
            if int(confirmed) < self.min_replicas:
                if not patient:
                    raise self._timeout(url, int(confirmed), self.wait_timeout_ms / 1000)
                self._confirm(url, int(confirmed), key=part(COUNTERS, url_shard(url)))
            return bool(appended)
        raise redis.exceptions.NoScriptError("the result script vanished again after SCRIPT LOAD")

    def _pipeline(self, key: str) -> redis.client.Pipeline:
        """A pipeline on one connection; on a cluster, to the primary serving ``key`` (WAIT
        counts the writes of its own connection, so the script and WAIT share one)."""
        if not isinstance(self.client, redis.cluster.RedisCluster):
            return self.client.pipeline(transaction=False)
        node = self.client.get_node_from_key(key)
        return self.client.get_redis_connection(node).pipeline(transaction=False)

    def _lost_node(self, error: BaseException) -> None:
        """A node-level pipeline failed (the primary gone, MOVED after a failover): the
        cluster client's slot map is reloaded so the caller's retry reaches the new primary."""
        if not isinstance(self.client, redis.cluster.RedisCluster) or isinstance(
                error, redis.exceptions.NoScriptError):
            return
        try:
            self.client.nodes_manager.initialize()
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            logger.warning("reloading the cluster's slot map failed (%s); the next command "
                           "tries again", exc)

    def confirm_replicated(self, url: str) -> None:
        """A redelivery found its URL's outcome already recorded: before that delivery is
        acked, the replicas must hold the outcome too (the first delivery's worker may have
        died inside its WAIT). A write and a WAIT, only with REDIS_MIN_REPLICAS; else nothing.

        Raises:
            ReplicaTimeout: still too few replicas after REDIS_WAIT_MAX_S.
        """
        if self.min_replicas > 0:
            self._confirm(url, 0, announce=False, key=part(COUNTERS, url_shard(url)))

    def _confirm(self, url: str, confirmed: int, announce: bool = True,
                 key: str = COUNTERS) -> None:
        """WAIT again until the replicas confirm, for up to REDIS_WAIT_MAX_S in all. Each try
        writes first (HINCRBY ``replica_waits``): WAIT counts the writes of the connection it
        runs on, and any later write of any connection covers the result. A Redis error (the
        primary demoted or gone) ends the wait: the caller holds the delivery and redoes it.

        Raises:
            ReplicaTimeout: still too few after REDIS_WAIT_MAX_S.
        """
        started = time.monotonic()
        if announce:
            logger.warning("%d of %d replicas confirmed the outcome of %s; not acked, waiting "
                           "for them (up to %gs)", confirmed, self.min_replicas, url,
                           self.wait_max_s)
        while time.monotonic() - started < self.wait_max_s:
            pipe = self._pipeline(key)  # ``key``: on a cluster, the URL's shard's counters
            pipe.hincrby(key, REPLICA_WAITS, 1)
            pipe.execute_command("WAIT", self.min_replicas, self.wait_timeout_ms)
            try:
                confirmed = int(pipe.execute()[1])
            except redis.exceptions.RedisError as exc:
                self._lost_node(exc)
                raise
            if confirmed >= self.min_replicas:
                if not announce:
                    return
                logger.info("replicas confirmed the outcome of %s after %.1fs", url,
                            time.monotonic() - started)
                return
        raise self._timeout(url, confirmed, self.wait_timeout_ms / 1000 + self.wait_max_s)

    def _timeout(self, url: str, confirmed: int, waited_s: float) -> ReplicaTimeout:
        return ReplicaTimeout(f"{confirmed} of {self.min_replicas} replicas confirmed the "
                              f"outcome of {url} within {waited_s:g}s")

    def record_failure(self, record: dict[str, Any], done: DoneMark | None) -> bool:
        """Append a dead-lettered URL's failure record to ``failures`` and mark it done, once."""
        return self.record(record, done=done, stream=FAILURES_STREAM)

    def count(self) -> int:
        return sum(int(self.client.xlen(name)) for name in parts(RESULTS_STREAM))

    def iter_records(self, start: str = "-", batch: int = 1000) -> Iterator[tuple[str, dict]]:
        """Every record from ``start`` (a stream id, inclusive) on, oldest first (on a
        cluster, part after part)."""
        for name in parts(RESULTS_STREAM):
            yield from self._iter_part(name, start, batch)

    def _iter_part(self, name: str, start: str, batch: int) -> Iterator[tuple[str, dict]]:
        cursor = start
        exclusive = False
        while True:
            low = f"({cursor}" if exclusive else cursor
            entries = self.client.xrange(name, min=low, max="+", count=batch)
            if not entries:
                return
            for entry_id, fields in entries:
                ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                yield ident, json.loads(fields[b"json"] if b"json" in fields else fields["json"])
            cursor, exclusive = ident, True


def record_keys(url: str, stream: str, done: DoneMark | None, permit_log: str | None,
                run_key: str) -> list[str]:
    """:data:`RECORD_LUA`'s KEYS; on a Redis Cluster all in the URL's domain shard (a job's
    run counters are refused there: fleet-wide)."""
    shard = url_shard(url)
    if run_key:
        refuse_on_cluster("a job's run counters")
    return [done.key if done else absent(shard), part(stream, shard), content_key(url),
            part(COUNTERS, shard), failures_key(url), permit_log or absent(shard),
            part(SINKS, shard), run_key or absent(shard)]


def _run_key(record: dict[str, Any]) -> str:
    """The counters of the record's run (its ``job`` and ``run`` fields); '' for the default
    job's records, which carry neither."""
    name, run = record.get("job"), record.get("run")
    return job_run_key(name, run) if isinstance(name, str) and type(run) is int else ""


def _run_counts(record: dict[str, Any], stream: str) -> tuple[str, int, str]:
    """ARGV[9..11] of the result script: the run counter, its bytes, a failure's reason."""
    if stream == FAILURES_STREAM:
        return "failed", 0, str(record.get("reason") or "unknown")
    size = record.get("bytes")
    return ("assets" if stream == ASSETS_STREAM else "results",
            size if type(size) is int and size > 0 else 0, "")


def encode(record: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON. orjson, an order of magnitude cheaper than json.dumps for a page's
    record (NOTES #25); it refuses what json would write as invalid JSON (NaN becomes null)."""
    return orjson.dumps(record)
