"""A Lua script the worker calls for every page, called with less of redis-py around it.

redis-py's ``Script.__call__`` goes through ``evalsha``, ``execute_command``, a retry wrapper,
timing and error hooks for its observability, and response callbacks: about 75 us of Python
a call here against about 35 us for the same EVALSHA sent on a pooled connection and read
back (NOTES #81). :class:`HotScript` does only the second, with the same rules:

* the connection comes from the client's pool (Sentinel's pool too, so a failover looks the
  same: a ConnectionError, READONLY turned into one) and, once its reply is read whole, waits
  in a short list of held connections that every HotScript on that pool shares: the next call
  takes it without the pool's lock, its observability counters and its readiness poll (a
  system call), ~8 us a call. A connection held idle for over :data:`RECHECK_IDLE_S` is
  polled as the pool would (a server that closed it: reconnected before the send); a failed
  one goes back to the pool closed; the pool's ``disconnect`` closes held ones too (they are
  in use to it), and a forked child starts with none;
* a reply that says NOSCRIPT (a restarted Redis, a promoted replica: the script cache is not
  replicated) loads the script and runs it again: nothing ran the first time;
* any other failure while sending or reading closes the connection and is raised, never
  retried (the library retries nothing: a script is never sent twice behind our back); an
  error reply (a script's error) leaves the connection usable and is raised;
* the reply is read through the connection's parser, so the worker's replies are waited for
  through the fetch loop (common/work/loop_redis.py) as before.

A client without a connection pool (none today) gets redis-py's own Script.
"""

from __future__ import annotations

import hashlib
import os
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

#: A held connection idle for longer is polled before it is used (see the module docstring).
RECHECK_IDLE_S = 1.0


class _Held:
    """The connections held between calls for one pool, (connection, when it was put back)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.idle: list[tuple[Any, float]] = []


_HELD: weakref.WeakKeyDictionary[Any, _Held] = weakref.WeakKeyDictionary()


class HotScript:
    """``script(keys, args)``: one EVALSHA of ``lua`` (see the module docstring)."""

    def __init__(self, client: redis.Redis, lua: str) -> None:
        self.client = client
        self.lua = lua
        self.sha = hashlib.sha1(lua.encode()).hexdigest()
        self._pool = pool = getattr(client, "connection_pool", None)
        self._fallback = client.register_script(lua) if pool is None else None
        self._held = _HELD.setdefault(pool, _Held()) if pool is not None else None

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self._fallback is not None:
            return self._fallback(keys=keys, args=args)
        try:
            return self._run(keys, args)
        except NoScriptError:
            self.sha = self.client.script_load(self.lua)
            return self._run(keys, args)

    def _run(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        conn = self._take()
        try:
            conn.send_command("EVALSHA", self.sha, len(keys), *keys, *args)
            reply = conn.read_response()
        except ResponseError:
            self._put_back(conn)  # an error reply, read whole: the connection is in step
            raise
        except BaseException:
            conn.disconnect()  # a reply may be half read or still coming: never reuse it
            self._pool.release(conn)
            raise
        self._put_back(conn)
        return reply

    def _take(self) -> Any:
        held = self._held
        if held.pid != os.getpid():  # a forked child: its parent's sockets are not its own
            held = self._held = _HELD[self._pool] = _Held()
        try:
            conn, since = held.idle.pop()  # atomic under the GIL: safe across fetch loops
        except IndexError:
            return self._pool.get_connection()
        if time.monotonic() - since > RECHECK_IDLE_S:
            try:
                if conn.can_read():  # closed by the server (EOF), or out of step
                    conn.disconnect()  # send_command connects it again
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()
        return conn

    def _put_back(self, conn: Any) -> None:
        self._held.idle.append((conn, time.monotonic()))
