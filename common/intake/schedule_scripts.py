"""The Lua scripts of the recrawl schedule (:mod:`common.intake.schedule`), one per step, each
atomic and one round trip.

Each script opens with the keys and arguments it takes. The keys (:mod:`common.store.keys`):
``schedule:state`` (HASH url → JSON ``{i, h, id, v, c, e, m}``), ``schedule:due`` (ZSET url →
next visit, Redis ms clock), ``schedule:inflight`` (HASH url → ``token:due_ms:taken_ms``) and
``schedule:lease`` (``token:owner``). Every time is Redis's own clock (``TIME``), so replicas
on hosts whose clocks differ agree on what is due.
"""

from __future__ import annotations

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1] schedule:state  KEYS[2] schedule:due  KEYS[3] schedule:inflight
# ARGV[1] '1': replace the interval and next visit of URLs already scheduled, '0': keep them
# ARGV[2..] url, interval s, first visit after ms; ... Returns {added, updated}.
ADD_LUA = _NOW + """
local added, updated = 0, 0
for i = 2, #ARGV, 3 do
  local url, iv, at = ARGV[i], tonumber(ARGV[i + 1]), now + tonumber(ARGV[i + 2])
  local raw = redis.call('HGET', KEYS[1], url)
  local st = nil
  if not raw then
    st = {i = iv, v = 0, c = 0}
    added = added + 1
  elseif ARGV[1] == '1' then
    st = cjson.decode(raw)
    st.i = iv
    updated = updated + 1
  end
  if st then
    redis.call('HSET', KEYS[1], url, cjson.encode(st))
    if redis.call('HEXISTS', KEYS[3], url) == 0 then
      redis.call('ZADD', KEYS[2], string.format('%d', at), url)
    end
  end
end
return {added, updated}
"""

# KEYS[1] schedule:lease  KEYS[2] schedule:due  KEYS[3] schedule:inflight
# KEYS[4] schedule:state
# ARGV[1] fencing token  ARGV[2] most URLs to take  ARGV[3] age (ms) after which an older
# token's in-flight entry is taken over (the caller's own, left by a tick that failed, at
# once: its loop takes only after settling). Returns false when the lease is not the caller's,
# else {url, due_ms, etag, last_modified, ...}: the validators the state holds ('' for none),
# read here so that publishing a batch costs no further round trip.
TAKE_LUA = _NOW + """
local held = redis.call('GET', KEYS[1])
if not held or string.match(held, '^(%d+):') ~= ARGV[1] then return false end
local token, limit, stale = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, n = {}, 0
local entry = ARGV[1] .. ':%s:' .. string.format('%d', now)
local function taken(url, due)
  local raw = redis.call('HGET', KEYS[4], url)
  local st = raw and cjson.decode(raw) or {}
  out[#out + 1] = url
  out[#out + 1] = due
  out[#out + 1] = type(st.e) == 'string' and st.e or ''
  out[#out + 1] = type(st.m) == 'string' and st.m or ''
end
local flat = redis.call('HGETALL', KEYS[3])
for i = 1, #flat, 2 do
  if n >= limit then break end
  local tok, due, was = string.match(flat[i + 1], '^(%d+):(%d+):(%d+)$')
  if tok and (tonumber(tok) == token or
              (tonumber(tok) < token and now - tonumber(was) >= stale)) then
    redis.call('HSET', KEYS[3], flat[i], string.format(entry, due))
    taken(flat[i], due)
    n = n + 1
  end
end
if n < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
                         limit - n)
  for i = 1, #due, 2 do
    local at = string.format('%d', tonumber(due[i + 1]))
    redis.call('ZREM', KEYS[2], due[i])
    redis.call('HSET', KEYS[3], due[i], string.format(entry, at))
    taken(due[i], at)
  end
end
return out
"""

# KEYS[1] schedule:inflight  KEYS[2] schedule:due  KEYS[3] schedule:state
# ARGV[1] fencing token  ARGV[2] 'next' (published: now + interval) or 'back' (not published:
# its old due time)  ARGV[3..] urls. Only entries still carrying the token; a URL removed from
# the schedule meanwhile is dropped. Returns how many were settled.
SETTLE_LUA = _NOW + """
local n = 0
for i = 3, #ARGV, 1 do
  local url = ARGV[i]
  local entry = redis.call('HGET', KEYS[1], url)
  local tok, due = string.match(entry or '', '^(%d+):(%d+):')
  if tok == ARGV[1] then
    redis.call('HDEL', KEYS[1], url)
    local raw = redis.call('HGET', KEYS[3], url)
    if raw then
      local at = due
      if ARGV[2] == 'next' then at = string.format('%d', now + cjson.decode(raw).i * 1000) end
      redis.call('ZADD', KEYS[2], at, url)
    end
    n = n + 1
  end
end
return n
"""

# KEYS[1] schedule:state  KEYS[2] schedule:due
# ARGV[1] min s  ARGV[2] max s  ARGV[3] growth  ARGV[4] shrink
# ARGV[5..] url, results stream id, kind ('h': content_hash to compare, 'u': unchanged (304),
# 'n': nothing to compare), hash, etag, last_modified ('' for none); ... Validators: a 304
# ('u') updates those it carries (it confirms the stored page, RFC 9111 §4.3.4); any other
# record carrying one replaces both (a new page: the old pair no longer describes it); a record
# carrying none keeps them. Returns how many intervals were adapted.
LEARN_LUA = _NOW + """
local function newer(a, b)
  if not b then return true end
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not bm then return true end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local lo, hi = tonumber(ARGV[1]), tonumber(ARGV[2])
local grow, shrink = tonumber(ARGV[3]), tonumber(ARGV[4])
local adapted = 0
for i = 5, #ARGV, 6 do
  local url, id, kind, hash = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local etag, modified = ARGV[i + 4], ARGV[i + 5]
  local raw = redis.call('HGET', KEYS[1], url)
  local st = raw and cjson.decode(raw)
  if st and newer(id, st.id) then
    st.id = id
    st.v = (st.v or 0) + 1
    if etag ~= '' or modified ~= '' then
      if kind ~= 'u' then st.e, st.m = nil, nil end
      if etag ~= '' then st.e = etag end
      if modified ~= '' then st.m = modified end
    end
    local changed = nil
    if kind == 'u' then
      changed = false
    elseif kind == 'h' then
      if st.h then changed = st.h ~= hash end
      st.h = hash
    end
    if changed ~= nil then
      local iv = st.i
      if changed then
        iv = math.floor((1 - shrink) * iv + shrink * lo)
        st.c = (st.c or 0) + 1
      else
        iv = math.ceil(iv * (1 + grow))
      end
      st.i = math.max(lo, math.min(hi, iv))
      redis.call('ZADD', KEYS[2], 'XX', string.format('%d', now + st.i * 1000), url)
      adapted = adapted + 1
    end
    redis.call('HSET', KEYS[1], url, cjson.encode(st))
  end
end
return adapted
"""
