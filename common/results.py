"""Results: one JSON record per URL, appended to the Redis stream ``results``.

Record fields: url, final_url, status, title, description, canonical, language, links,
links_count, text_length, content_hash, content_type, bytes, truncated, fetched_at,
elapsed_ms, worker, queue, depth, attempts, cached, error. The stream is capped with an
approximate MAXLEN (``RESULTS_MAXLEN``) so it cannot grow without bound; readers use XRANGE /
XREAD from an id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import redis

from common.keys import COUNTERS, RESULTS_STREAM, content_key, failures_key
from common.ratelimit import retime_permit

# KEYS[1] done:{b}  KEYS[2] results   ARGV[1] done member  ARGV[2] record JSON  ARGV[3] maxlen
# Appends the result only if the URL was not done yet; returns 1 when appended.
RECORD_ONCE_LUA = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'json', ARGV[2])
return 1
"""


class ResultStore:
    def __init__(self, client: redis.Redis, maxlen: int) -> None:
        self.client = client
        self.maxlen = maxlen
        self._record_once = client.register_script(RECORD_ONCE_LUA)
        self._record_once_loaded = False

    def record(self, record: dict[str, Any], *, cache: tuple[bytes, int] | None = None,
               counters: dict[str, int] | None = None, clear_failures: bool = False,
               done: tuple[str, int] | None = None,
               retime: tuple[tuple[str, str] | None, float | None] | None = None) -> None:
        """Append one result and do the URL's other bookkeeping in the same round trip:
        store the response in the cache (value, ttl_s), bump counters, and clear the URL's
        retry counter after a success. With ``done`` (done-set key, member) the result is
        appended only if the URL has no recorded outcome yet: one result per URL even when
        a delivery is processed twice."""
        if done is not None and not self._record_once_loaded:
            # redis-py's Script in a pipeline sends SCRIPT EXISTS before every pipeline (an
            # extra round trip a page); load it once and call EVALSHA ourselves.
            self._record_once.sha = self.client.script_load(RECORD_ONCE_LUA)
            self._record_once_loaded = True
        pipe = self.client.pipeline(transaction=False)
        if done is not None:
            pipe.evalsha(self._record_once.sha, 2, done[0], RESULTS_STREAM, done[1],
                         encode(record), self.maxlen)
        else:
            pipe.xadd(RESULTS_STREAM, {"json": encode(record)}, maxlen=self.maxlen,
                      approximate=True)
        if cache is not None:
            pipe.set(content_key(record["url"]), cache[0], ex=cache[1])
        for name, amount in (counters or {}).items():
            pipe.hincrby(COUNTERS, name, amount)
        if clear_failures:
            pipe.delete(failures_key(record["url"]))
        if retime is not None:
            retime_permit(pipe, *retime)
        replies = pipe.execute(raise_on_error=False)
        if done is not None and isinstance(replies[0], redis.exceptions.NoScriptError):
            # Redis restarted and lost its script cache; the rest of the pipeline ran. Load
            # the script and run just the result append again.
            self._record_once.sha = self.client.script_load(RECORD_ONCE_LUA)
            self.client.evalsha(self._record_once.sha, 2, done[0], RESULTS_STREAM, done[1],
                                encode(record), self.maxlen)
            replies = replies[1:]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

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


def encode(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)
