"""The fetch loop (common/web/multi.py): many fetches and sleeps in one thread, none holding
the others, against a real local site. tests/web/test_fetch.py runs every Fetcher test inside
a loop as well; these are about the loop itself."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
import socket
import threading
import time

import greenlet
import pycurl
import pytest
import redis

from common.core.config import Settings
from common.core.errors import FetchError
from common.web import multi
from common.web.curl import perform_once
from common.web.fetch import Fetcher
from common.web.multi import FetchLoop
from common.work.loop_redis import loop_client_options
from tests.helpers import in_fetch_loop

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def _fetcher(networks: tuple = LOOPBACK) -> Fetcher:
    return Fetcher(Settings().with_overrides(fetch_allow_networks=networks))


@pytest.fixture
def loop():
    made = FetchLoop()
    yield made
    made.close()


def _run_all(loop: FetchLoop) -> None:
    while loop.tasks:
        loop.run_once(0.1, lambda: False)


def test_a_slow_page_does_not_hold_the_other_fetches_of_its_loop(loop, site):
    fetcher = _fetcher()
    finished: list[str] = []

    def slow() -> None:
        fetcher.fetch(site.url("/slow/1.5"))
        finished.append("slow")

    def fast(n: int) -> None:
        assert fetcher.fetch(site.page_url(n)).status == 200
        finished.append(f"page {n}")

    loop.spawn(slow)
    for n in range(1, 6):
        loop.spawn(fast, n)
    _run_all(loop)
    fetcher.close()
    # All in one thread: had a transfer blocked it, the slow page would have come first.
    assert finished[-1] == "slow" and loop.tasks == 0
    assert sorted(finished[:-1]) == [f"page {n}" for n in range(1, 6)]


def test_a_sleeping_task_lets_the_others_run_and_wakes_in_order(loop):
    order: list[str] = []

    def sleeper(name: str, seconds: float) -> None:
        multi.sleep(seconds)
        order.append(name)

    loop.spawn(sleeper, "long", 0.3)
    loop.spawn(sleeper, "short", 0.05)
    loop.spawn(order.append, "none")
    _run_all(loop)
    assert order == ["none", "short", "long"]


def test_a_sleep_ends_early_once_its_event_is_set(loop):
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    in_fetch_loop(loop, multi.sleep, 60, until=stop)
    assert stop.is_set() and time.monotonic() - started < 30  # not the 60 s asked for


def test_outside_a_loop_perform_and_sleep_block_the_caller_as_usual(site):
    fetcher = _fetcher()
    assert fetcher.fetch(site.page_url(1)).status == 200  # curl.perform() in this thread
    stop = threading.Event()
    stop.set()
    multi.sleep(60, until=stop)  # returns at once: the event is set
    fetcher.close()


def test_a_transfer_error_reaches_its_task_as_the_same_fetch_error(loop):
    fetcher = _fetcher()
    with pytest.raises(FetchError) as info:
        in_fetch_loop(loop, fetcher.fetch, f"http://127.0.0.1:{_closed_port()}/")
    assert info.value.kind == "connection" and info.value.transient
    fetcher.close()


def test_a_refused_address_is_refused_inside_a_loop(loop, site):
    fetcher = _fetcher(())
    with pytest.raises(FetchError) as info:
        in_fetch_loop(loop, fetcher.fetch, site.page_url(1))
    assert info.value.kind == "blocked" and not site.log  # nothing reached the site
    fetcher.close()


def test_a_waiting_loop_is_woken_from_another_thread(loop):
    threading.Timer(0.1, loop.wake).start()
    started = time.monotonic()
    loop.run_once(60, lambda: False)  # nothing to do: it waits until woken
    assert time.monotonic() - started < 30


def test_a_loop_that_says_it_wants_work_does_not_wait(loop):
    started = time.monotonic()
    loop.run_once(60, lambda: True)
    assert time.monotonic() - started < 30


def test_concurrent_fetches_use_one_handle_each_and_give_them_back(loop, site):
    fetcher = _fetcher()
    seen: set[int] = set()

    def fetch(n: int) -> None:
        fetcher.fetch(site.url(f"/slow/0.{n}"))

    real_perform = multi.perform

    def spy(curl: pycurl.Curl) -> None:
        seen.add(id(curl))
        real_perform(curl)

    multi.perform = spy  # the fetcher calls multi.perform through the module
    try:
        for n in range(1, 5):
            loop.spawn(fetch, n)
        _run_all(loop)
    finally:
        multi.perform = real_perform
    assert len(seen) == 4 and len(fetcher._idle) == 4  # four at once, all given back
    fetcher.close()
    assert fetcher._idle == []


def test_a_task_that_raises_is_logged_and_the_loop_goes_on(loop, caplog):
    def broken() -> None:
        raise RuntimeError("a bug in a task")

    done: list[int] = []
    loop.spawn(broken)
    loop.spawn(done.append, 1)
    _run_all(loop)
    assert done == [1] and loop.tasks == 0
    assert "a fetch task failed" in caplog.text and "a bug in a task" in caplog.text


def test_finished_tasks_greenlets_run_the_next_tasks_with_nothing_left_of_the_last(loop):
    seen: list[tuple[greenlet.greenlet, bool]] = []  # held: no address is reused meanwhile

    def task(fail: bool) -> None:
        current = greenlet.getcurrent()
        seen.append((current, current.yields))
        if fail:
            with multi.yielding():  # ends by raising, inside yielding()
                raise RuntimeError("a bug in a task")

    for _ in range(3):
        loop.spawn(task, False)
    _run_all(loop)
    first = [task for task, _yields in seen]
    assert len(set(map(id, first))) == 3  # three at once: three greenlets
    loop.spawn(task, True)
    _run_all(loop)
    for _ in range(3):
        loop.spawn(task, False)
    _run_all(loop)
    assert all(any(later is earlier for earlier in first) for later, _ in seen[3:]), \
        "a new greenlet ran a task while finished ones were idle"
    assert not any(yields for _task, yields in seen) and loop.tasks == 0


def test_an_idle_task_woken_by_mistake_waits_on_for_its_next_run(loop, caplog):
    ran: list[int] = []
    loop.spawn(ran.append, 1)
    _run_all(loop)
    idle = loop._idle[0]  # noqa: SLF001 - the loop's own idle task
    loop._ready.append((idle, (None,)))  # noqa: SLF001 - a wake-up meant for another wait
    loop.run_once(0.0, lambda: False)
    assert "an idle fetch task was resumed with None" in caplog.text and not idle.dead
    loop.spawn(ran.append, 2)
    _run_all(loop)
    assert ran == [1, 2] and loop.tasks == 0


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the block ends: nothing listens


def test_a_loop_fetches_when_its_sockets_are_numbered_past_1023(loop, site):
    # select() cannot watch a descriptor past FD_SETSIZE (1,024); a long-running worker's
    # sockets can be numbered that high, so the loop waits with poll().
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.dup(0) for _ in range(max(0, 1100 - _highest_fd()))]
    try:
        fetcher = _fetcher()
        assert in_fetch_loop(loop, fetcher.fetch, site.url("/slow/0.2")).status == 200
        fetcher.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _highest_fd() -> int:
    probe = os.dup(0)
    os.close(probe)
    return probe


# -- Redis replies through the loop (common/work/loop_redis.py) ------------------------------

_BUSY_LUA = "local i = 0 while i < tonumber(ARGV[1]) do i = i + 1 end return i"


def _order_around_a_slow_script(loop: FetchLoop, client: redis.Redis, yields: bool) -> list[str]:
    order: list[str] = []

    def slow_script() -> None:
        with multi.yielding() if yields else contextlib.nullcontext():
            client.eval(_BUSY_LUA, 0, 20_000_000)  # Redis busy for a while
        order.append("script")

    def other() -> None:
        multi.sleep(0.01)
        order.append("other")

    loop.spawn(slow_script)
    loop.spawn(other)
    _run_all(loop)
    return order


def test_a_task_waiting_for_a_redis_reply_inside_yielding_lets_the_loop_run_others(
        loop, settings):
    client = redis.Redis.from_url(settings.redis_url, **loop_client_options())
    assert _order_around_a_slow_script(loop, client, yields=True) == ["other", "script"]
    # Outside yielding the reply is read blocking, as everywhere but the two per-page scripts.
    assert _order_around_a_slow_script(loop, client, yields=False) == ["script", "other"]
    client.close()



def test_the_send_time_of_a_transfer_a_busy_loop_drives_late_is_never_before_the_real_send(
        loop, site):
    # libcurl's clock starts when the loop first drives the transfer: here 0.3 s after the
    # task handed it over, while another task holds the loop. The permit is re-timed to the
    # send time this returns (NOTES #11), so it must not be earlier than the site's arrival.
    curl = pycurl.Curl()
    curl.setopt(pycurl.WRITEFUNCTION, lambda _chunk: None)
    sent: list[float | None] = []
    site.clear_log()

    def fetch() -> None:
        error, sent_at = perform_once(curl, site.page_url(1), 5000, 2.0)
        assert error is None
        sent.append(sent_at)

    def hold_the_loop() -> None:
        time.sleep(0.3)  # blocks the loop's thread: no multi.sleep

    loop.spawn(fetch)
    loop.spawn(hold_the_loop)
    _run_all(loop)
    curl.close()

    arrived = site.requests_for("/page/")[0].wall_time_s
    assert sent[0] is not None
    assert sent[0] >= arrived - 0.005, f"recorded {arrived - sent[0]:.3f}s before the arrival"
