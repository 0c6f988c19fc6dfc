"""Sessions: who the fleet is to a site, shared by every worker through Redis.

A session is a cookie jar (common/web/cookies.py) of one job on one site, named
``"slot.generation"``. Without a pool (SESSION_POOL_SIZE 0) a job has one session per site,
``"0.0"``: its jar is the hash ``cookie_jar_key(job, site, "0.0")``, read with one HGETALL.

With a pool of N (Crawlee's SessionPool is the model) a job has N slots per site in the hash
``session_pool_key(job, site)``: slot -> its generation, ``{slot}:uses`` -> requests served.
A page takes a slot (spread at random over the N: each is healthy, a retired one being
replaced at once by its next generation with an empty jar) and the open script returns the
slot's generation and jar in the same round trip, counting the use: past SESSION_MAX_USES the
slot moves to its next generation first. :meth:`SessionPool.retire` moves a slot to its next
generation only if the session is still the current one (a Lua compare-and-increment), so two
workers retiring the same session retire it once, and a page that got its answer from an
older generation retires nothing.

Cost per page: one round trip to open (read the jar; none without a pool, whose jar the admit
script returns with the page's turn: common/web/ratelimit.py), none to settle unless a response changed
the jar (then one: HSET/HDEL of the changed fields and PEXPIRE, so two workers' changes merge
cookie by cookie; for a pooled session only while its generation is current, so a retired
session's jar is not brought back).

Key schema (common/store/keys.py): the scripts build a slot's jar key from ``jar_prefix``
(``cookie_jar_key(job, site, "")``) and ``"slot.generation"``, since the generation is only
known inside the script; every key of one (job, site) shares the same ``{job}|{site}`` part.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import redis

from common.store.keys import COUNTERS, cookie_jar_key, session_pool_key
from common.store.slots import domain_shard, part
from common.web.cookies import Jar

__all__ = ["Session", "SessionPool"]

POOL_TTL_S = 86_400  # a pool's hash lives a day after its last use

# KEYS[1] sessions:{job}|{site}
# ARGV[1] the jar key prefix (cookies:{job}|{site}|)  ARGV[2] the slot  ARGV[3] SESSION_MAX_USES
# (0: no limit)  ARGV[4] the pool's TTL (s). Counts one use of the slot (past the limit its next
# generation, with an empty jar, takes its place). Returns {generation, jar fields and values}.
OPEN_LUA = """
local slot = ARGV[2]
local gen = tonumber(redis.call('HGET', KEYS[1], slot) or '0')
local uses = redis.call('HINCRBY', KEYS[1], slot .. ':uses', 1)
local max_uses = tonumber(ARGV[3])
if max_uses > 0 and uses > max_uses then
  redis.call('DEL', ARGV[1] .. slot .. '.' .. gen)
  gen = redis.call('HINCRBY', KEYS[1], slot, 1)
  redis.call('HSET', KEYS[1], slot .. ':uses', 1)
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {gen, redis.call('HGETALL', ARGV[1] .. slot .. '.' .. gen)}
"""

# KEYS[1] sessions:{job}|{site}  KEYS[2] the session's jar  KEYS[3] stats:counters
# ARGV[1] the slot  ARGV[2] its generation. Retires the session if it is still the slot's
# current one: the next generation (an empty jar, no uses), counted ``sessions_retired``.
# Returns 1 if it did, else 0.
RETIRE_LUA = """
local gen = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if gen ~= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HSET', KEYS[1], ARGV[1] .. ':uses', 0)
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', KEYS[3], 'sessions_retired', 1)
return 1
"""

# KEYS[1] the session's jar  KEYS[2] sessions:{job}|{site}
# ARGV[1] the slot  ARGV[2] its generation  ARGV[3] the jar's TTL (ms)  ARGV[4] how many
# field/value pairs follow; then the pairs, then the fields to delete. Writes only while the
# session is the slot's current one. Returns 1 if it wrote, else 0.
SAVE_LUA = """
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') ~= tonumber(ARGV[2]) then
  return 0
end
local pairs_end = 4 + 2 * tonumber(ARGV[4])
if pairs_end > 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 5, pairs_end)) end
if #ARGV > pairs_end then redis.call('HDEL', KEYS[1], unpack(ARGV, pairs_end + 1)) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


@dataclass(slots=True)
class Session:
    """One page's session: which it is, and its jar as loaded (the page changes it)."""

    job: str
    site: str
    slot: int
    generation: int
    jar: Jar
    pooled: bool

    @property
    def name(self) -> str:
        """``"slot.generation"``, the ``{session}`` of its keys."""
        return f"{self.slot}.{self.generation}"

    @property
    def key(self) -> str:
        """``job|site|session``: a sticky proxy's key, a login lock's subject."""
        return f"{self.job}|{self.site}|{self.name}"

    @property
    def jar_key(self) -> str:
        return cookie_jar_key(self.job, self.site, self.name)


class SessionPool:
    """Sessions of every (job, site), in Redis; shared by a worker's fetch loops (threads)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._open = client.register_script(OPEN_LUA)
        self._retire = client.register_script(RETIRE_LUA)
        self._save = client.register_script(SAVE_LUA)

    def open(self, job: str, site: str, *, pool_size: int, max_uses: int = 0,
             max_cookies: int = 100, max_bytes: int = 65536,
             preloaded: dict[bytes, bytes] | None = None) -> Session:
        """A session of ``job`` on ``site`` and its jar, in one round trip: ``"0.0"``
        without a pool (``pool_size`` 0), else a slot taken at random and its current
        generation (the next one past ``max_uses``). ``preloaded``: the ``"0.0"`` jar's
        fields as the admit script read them (no round trip at all)."""
        if pool_size <= 0:
            fields = preloaded if preloaded is not None else \
                self.client.hgetall(cookie_jar_key(job, site, "0.0"))
            return Session(job, site, 0, 0, Jar(fields, max_cookies=max_cookies,
                                                 max_bytes=max_bytes), False)
        slot = random.randrange(pool_size)
        generation, flat = self._open(
            keys=[session_pool_key(job, site)],
            args=[cookie_jar_key(job, site, ""), slot, max_uses, POOL_TTL_S])
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return Session(job, site, slot, int(generation),
                       Jar(fields, max_cookies=max_cookies, max_bytes=max_bytes), True)

    def save(self, session: Session, meta: dict[str, str] | None = None) -> bool:
        """Write what the page changed in the jar (and ``meta`` fields, a login's state): no
        round trip when nothing did. False: a pooled session retired meanwhile (not written).
        """
        changed, gone = session.jar.changes()
        if meta:
            changed = {**changed, **meta}
        if not changed and not gone:
            return True
        ttl_ms = session.jar.ttl_ms()
        if not session.pooled:
            pipe = self.client.pipeline(transaction=True)
            if changed:
                pipe.hset(session.jar_key, mapping=changed)
            if gone:
                pipe.hdel(session.jar_key, *gone)
            pipe.pexpire(session.jar_key, ttl_ms)
            pipe.execute()
            written = True
        else:
            flat = [item for pair in changed.items() for item in pair]
            written = self._save(keys=[session.jar_key,
                                       session_pool_key(session.job, session.site)],
                                 args=[session.slot, session.generation, ttl_ms,
                                       len(changed), *flat, *gone]) == 1
        session.jar.saved()
        return written

    def retire(self, session: Session) -> bool:
        """Retire a pooled session (a blocking answer): its slot's next generation, with an
        empty jar, takes its place. False: it was retired already (by another page)."""
        if not session.pooled:
            return False
        return self._retire(keys=[session_pool_key(session.job, session.site),
                                  session.jar_key, part(COUNTERS, domain_shard(session.site))],
                            args=[session.slot, session.generation]) == 1
