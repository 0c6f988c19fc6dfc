"""A Lua script the worker calls for every page, called with less of redis-py around it.

redis-py's ``Script.__call__`` goes through ``evalsha``, ``execute_command``, a retry wrapper,
timing and error hooks for its observability, and response callbacks: about 75 us of Python
a call here against about 35 us for the same EVALSHA sent on a pooled connection and read
back (NOTES #81). :class:`HotScript` does only the second, with the same rules:

* the connection comes from the client's pool (Sentinel's pool too, so a failover looks the
  same: a ConnectionError, READONLY turned into one) and, once its reply is read whole, waits
  in a short list of held connections that every HotScript on that pool shares: the next call
  takes it without the pool's lock and observability counters. Before each send it is asked,
  as the pool asks, whether it has anything to read: one ``poll`` with no wait (the pool's
  check switches the socket's timeout off and on around a read: three system calls). Readable
  means closed by the server (a restart, a client timeout) or out of step: it is closed and
  connects again before the send, so a restart between two calls costs no call. A failed
  connection goes back to the pool closed; the pool's ``disconnect`` closes held ones too
  (they are in use to it), and a forked child starts with none;
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
import select
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

#: Per pool, the connections held between calls (see the module docstring).
_HELD: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _forget_held() -> None:
    """In a forked child the held connections are its parent's sockets: let go of them (the
    pool gives the child its own; no system call per call to find out who we are)."""
    for idle in list(_HELD.values()):
        idle.clear()


os.register_at_fork(after_in_child=_forget_held)


class HotScript:
    """``script(keys, args)``: one EVALSHA of ``lua`` (see the module docstring)."""

    def __init__(self, client: redis.Redis, lua: str) -> None:
        self.client = client
        self.lua = lua
        self.sha = hashlib.sha1(lua.encode()).hexdigest()
        self._pool = pool = getattr(client, "connection_pool", None)
        self._fallback = client.register_script(lua) if pool is None else None
        self._held = _HELD.setdefault(pool, []) if pool is not None else None

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
        try:
            conn = self._held.pop()  # atomic under the GIL: safe across fetch loops
        except IndexError:
            return self._pool.get_connection()
        sock = conn._sock
        if sock is not None:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if poller.poll(0):  # EOF (closed by the server), an error, or stray bytes
                conn.disconnect()  # send_command connects it again
        return conn

    def _put_back(self, conn: Any) -> None:
        self._held.append(conn)
