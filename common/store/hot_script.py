"""A Lua script the worker calls for every page, called with less of redis-py around it.

redis-py's ``Script.__call__`` goes through ``evalsha``, ``execute_command``, a retry wrapper,
timing and error hooks for its observability, and response callbacks: about 75 us of Python
a call here against about 35 us for the same EVALSHA sent on a pooled connection and read
back (NOTES #81). :class:`HotScript` does only the second, with the same rules:

* the connection comes from the client's pool and goes back to it (Sentinel's pool too, so a
  failover looks the same: a ConnectionError, READONLY turned into one);
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
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError


class HotScript:
    """``script(keys, args)``: one EVALSHA of ``lua`` (see the module docstring)."""

    def __init__(self, client: redis.Redis, lua: str) -> None:
        self.client = client
        self.lua = lua
        self.sha = hashlib.sha1(lua.encode()).hexdigest()
        self._pool = getattr(client, "connection_pool", None)
        self._fallback = client.register_script(lua) if self._pool is None else None

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self._fallback is not None:
            return self._fallback(keys=keys, args=args)
        try:
            return self._run(keys, args)
        except NoScriptError:
            self.sha = self.client.script_load(self.lua)
            return self._run(keys, args)

    def _run(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        pool = self._pool
        conn = pool.get_connection()
        try:
            conn.send_command("EVALSHA", self.sha, len(keys), *keys, *args)
            return conn.read_response()
        except ResponseError:
            raise  # an error reply, read whole: the connection is still in step
        except BaseException:
            conn.disconnect()  # a reply may be half read or still coming: never reuse it
            raise
        finally:
            pool.release(conn)
