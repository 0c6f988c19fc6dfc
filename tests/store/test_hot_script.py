"""HotScript: the per-page scripts' EVALSHA without redis-py's layers, with its rules kept
(common/store/hot_script.py), against a real Redis."""

from __future__ import annotations

import os
import time

import pytest
import redis

from common.store import hot_script
from common.store.hot_script import HotScript

COUNT_LUA = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAIL_LUA = "return redis.error_reply('nope: ' .. ARGV[1])"
SLOW_LUA = "local t = redis.call('TIME'); local s = t[1] * 1e6 + t[2]\n" \
           "repeat local n = redis.call('TIME') until n[1] * 1e6 + n[2] - s > 300000\nreturn 1"


def test_a_hot_script_runs_with_its_keys_and_args(redis_client: redis.Redis) -> None:
    script = HotScript(redis_client, COUNT_LUA)

    assert script(["hot:count"], [5]) == 5
    assert script(keys=["hot:count"], args=[2]) == 7
    assert redis_client.get("hot:count") == b"7"


def test_a_flushed_script_cache_loads_the_script_and_runs_it_once(
        redis_client: redis.Redis) -> None:
    script = HotScript(redis_client, COUNT_LUA)
    script(["hot:flushed"], [1])
    redis_client.script_flush()  # as a restarted Redis or a promoted replica

    assert script(["hot:flushed"], [1]) == 2  # run once more, not twice
    assert redis_client.script_exists(script.sha) == [True]


def test_an_error_reply_is_raised_and_the_connection_stays_usable(
        redis_client: redis.Redis) -> None:
    failing, counting = HotScript(redis_client, FAIL_LUA), HotScript(redis_client, COUNT_LUA)
    redis_client.script_load(FAIL_LUA)  # no NOSCRIPT detour (its SCRIPT LOAD takes a connection)
    counting(["hot:before-error"], [1])
    before = redis_client.connection_pool._created_connections

    with pytest.raises(redis.ResponseError, match="nope: x"):
        failing(["hot:any"], ["x"])

    assert counting(["hot:after-error"], [3]) == 3  # the reply was read whole
    assert redis_client.connection_pool._created_connections == before


def test_a_timed_out_reply_closes_its_connection_and_is_not_sent_again(
        redis_client: redis.Redis) -> None:
    impatient = redis.Redis(connection_pool=redis.ConnectionPool(
        **{**redis_client.connection_pool.connection_kwargs, "socket_timeout": 0.05}))
    slow_lua = "redis.call('INCR', KEYS[1])\n" + SLOW_LUA
    slow = HotScript(impatient, slow_lua)
    try:
        impatient.script_load(slow_lua)  # no NOSCRIPT detour: one connection in all
        with pytest.raises(redis.TimeoutError):
            slow(["hot:slow-runs"], [])
        pool = impatient.connection_pool
        assert all(conn._sock is None for conn in pool._available_connections)  # closed
        time.sleep(0.35)  # the script's own 300 ms in Redis

        assert HotScript(impatient, COUNT_LUA)(["hot:next"], [1]) == 1  # a fresh connection
        assert redis_client.get("hot:slow-runs") == b"1"  # sent once, not retried
    finally:
        impatient.close()


def test_a_held_connection_the_server_closed_is_reconnected_before_its_next_send(
        redis_client: redis.Redis) -> None:
    script = HotScript(redis_client, COUNT_LUA)
    assert script(["hot:held"], [1]) == 1  # its connection is held now
    other = redis.Redis(connection_pool=redis.ConnectionPool(
        **redis_client.connection_pool.connection_kwargs))
    try:
        killed = other.client_kill_filter(_type="normal", skipme=True)  # e.g. a Redis timeout
    finally:
        other.close()
    assert killed >= 1

    assert script(["hot:held"], [1]) == 2  # polled, found closed, connected again, run once


def test_a_forked_child_lets_go_of_its_parents_held_connections(redis_client: redis.Redis) -> None:
    script = HotScript(redis_client, COUNT_LUA)
    script(["hot:forked"], [1])  # its connection is held now
    assert hot_script._HELD[redis_client.connection_pool]

    pid = os.fork()
    if pid == 0:  # the child: no parent's socket to send on
        os._exit(0 if not hot_script._HELD[redis_client.connection_pool] else 1)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert script(["hot:forked"], [1]) == 2  # the parent's connection still held, still works
