"""Results: one JSON record per URL, appended to the Redis stream ``results``.

Record fields: url, final_url, status, title, description, canonical, language, links,
links_count, links_truncated, text_length, content_hash, encoding, content_type, bytes,
truncated, skipped, redirects, followed, fetched_at, elapsed_ms, worker, queue, depth, attempts,
cached, error; when something was cut: ``<field>_truncated``, links_kept, record_truncated
(caps: common/work/record.py). A dead-lettered URL leaves a failure
record in the stream ``failures`` instead (``"outcome": "dead_letter"``, reason, attempts,
last_status, last_error, first_failure), appended once its dead letter is confirmed, so every
URL's final outcome is in one of the two streams. With no result sink registered (``sinks``)
both are capped with an approximate MAXLEN (``RESULTS_MAXLEN``) so they cannot grow without
bound; with sinks, the sinks trim them below what every sink has acknowledged. Readers use
XRANGE / XREAD from an id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import redis

from common.store.keys import (
    COUNTERS,
    FAILURES_STREAM,
    RESULTS_STREAM,
    SINKS,
    content_key,
    failures_key,
)
from common.store.marks import DoneMark, Retime

# One script, one round trip, for everything a fetched page leaves in Redis.
# KEYS[1] done:{b} ('' = no once-only check)  KEYS[2] results (or failures)  KEYS[3] content:{url}
# KEYS[4] stats:counters  KEYS[5] failures:{url}  KEYS[6] ratelimit:{domain} ('' = no permit)
# KEYS[7] sinks (the registered result sinks: with any, the sinks trim the stream, not MAXLEN)
# ARGV[1] done member  ARGV[2] record JSON  ARGV[3] results maxlen
# ARGV[4] cache value ('' = do not cache)  ARGV[5] cache TTL s  ARGV[6] clear failures (0/1)
# ARGV[7] permit member  ARGV[8] send time ms  ARGV[9..] counter name, amount, ...
# Appends the result only if the URL was not done yet; returns 1 when appended.
RECORD_LUA = """
local appended = 1
if KEYS[1] ~= '' and redis.call('SADD', KEYS[1], ARGV[1]) == 0 then
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
if KEYS[6] ~= '' then redis.call('ZADD', KEYS[6], 'XX', 'GT', ARGV[8], ARGV[7]) end
for i = 9, #ARGV, 2 do redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
return appended
"""


class ResultStore:
    def __init__(self, client: redis.Redis, maxlen: int) -> None:
        self.client = client
        self.maxlen = maxlen
        self._record = client.register_script(RECORD_LUA)

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
        """
        permit, sent_at = retime or (None, None)
        if sent_at is None:
            permit = None
        url = record["url"]
        keys = [done.key if done else "", stream, content_key(url), COUNTERS,
                failures_key(url), permit.log_key if permit else "", SINKS]
        args: list[Any] = [done.member if done else 0, encode(record), self.maxlen,
                           cache[0] if cache else b"", cache[1] if cache else 0,
                           1 if clear_failures else 0, permit.member if permit else "",
                           int(sent_at * 1000) if permit else 0]
        for name, amount in (counters or {}).items():
            args += (name, amount)
        # redis-py's Script runs EVALSHA and loads the script after a NoScriptError (a
        # restarted Redis); nothing ran in that case, so running it again is safe.
        return bool(self._record(keys=keys, args=args))

    def record_failure(self, record: dict[str, Any], done: DoneMark | None) -> bool:
        """Append a dead-lettered URL's failure record to ``failures`` and mark it done, once."""
        return self.record(record, done=done, stream=FAILURES_STREAM)

    def count(self) -> int:
        return int(self.client.xlen(RESULTS_STREAM))

    def iter_records(self, start: str = "-", batch: int = 1000) -> Iterator[tuple[str, dict]]:
        """Every record from ``start`` (a stream id, inclusive) on, oldest first."""
        cursor = start
        exclusive = False
        while True:
            low = f"({cursor}" if exclusive else cursor
            entries = self.client.xrange(RESULTS_STREAM, min=low, max="+", count=batch)
            if not entries:
                return
            for entry_id, fields in entries:
                ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                yield ident, json.loads(fields[b"json"] if b"json" in fields else fields["json"])
            cursor, exclusive = ident, True


def encode(record: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON. orjson, an order of magnitude cheaper than json.dumps for a page's
    record (NOTES #25); it refuses what json would write as invalid JSON (NaN becomes null)."""
    return orjson.dumps(record)
