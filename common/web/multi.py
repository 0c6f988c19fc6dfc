"""Many fetches in one thread: libcurl's multi interface, and a greenlet for each task.

Eight fetch threads sharing one GIL traded it at every C call that releases it (libcurl's
transfer and each of its callbacks, lxml, zstd, every Redis send and receive): 21-41 context
switches and a quarter of the worker's CPU in the kernel per page (NOTES #26). A
:class:`FetchLoop` runs its tasks in one thread instead. A task is a greenlet running plain
blocking code (the worker's whole :class:`~common.work.processor.Processor`); it is switched
out only where it would wait:

* :func:`perform`, one libcurl transfer: the easy handle joins the loop's multi handle and the
  task waits until libcurl reports the transfer done (or failed: the same ``pycurl.error``
  ``curl.perform()`` raises);
* :func:`sleep`: a timer (a rate-limit slot a few milliseconds away, a wait for Redis).

Outside a loop's task (a producer's robots.txt, the sitemap tools, tests) both block the
calling thread as ``curl.perform()`` and ``time.sleep`` do, so the code calling them does not
know which it runs under. Everything else a task does (Redis calls, parsing, publishing) runs to
its end without a switch, so no lock is ever held across one and thread locks stay correct.
Why greenlets rather than asyncio: the processor stays the synchronous code it is, with
redis-py, pika and lxml as they are; only the two waits above know about the loop.

The loop waits in ``select`` on libcurl's sockets and a wake-up socket, which another thread
writes (:meth:`FetchLoop.wake`) only when the loop sleeps and has said it wants work.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import greenlet
import pycurl

logger = logging.getLogger(__name__)

#: Longest a task sleeps at once while it waits for an event (see :func:`sleep`).
_EVENT_SLICE_S = 0.25


class _Task(greenlet.greenlet):
    """A greenlet run by a :class:`FetchLoop`; ``loop`` is how :func:`perform` finds it."""

    loop: FetchLoop | None = None


class FetchLoop:
    """Runs tasks (greenlets) and their libcurl transfers and timers, in the thread that made it.

    ``max_connects``: the multi handle's connection cache (keep-alive connections kept idle).
    """

    def __init__(self, max_connects: int = 32) -> None:
        self._hub = greenlet.getcurrent()
        self._thread = threading.get_ident()
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connects)
        self._transfers: dict[pycurl.Curl, _Task] = {}
        self._timers: list[tuple[float, int, _Task]] = []
        self._ready: collections.deque[tuple[_Task, tuple[Any, ...]]] = collections.deque()
        self._seq = itertools.count()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self.asleep = False  # in select, waiting: another thread must wake() it
        self.tasks = 0  # started and not finished

    def close(self) -> None:
        self._multi.close()
        self._wake_in.close()
        self._wake_out.close()

    def spawn(self, run: Callable[..., object], *args: Any) -> None:
        """Start ``run(*args)`` as a task at the loop's next turn."""
        task = _Task(run=self._guarded(run), parent=self._hub)
        task.loop = self
        self.tasks += 1
        self._ready.append((task, args))

    def wake(self) -> None:
        """From any thread: end the loop's wait (one byte on the wake-up socket)."""
        try:
            self._wake_out.send(b"\0")
        except BlockingIOError:
            logger.debug("wake-up socket full: the loop is being woken already")

    def run_once(self, timeout_s: float, wanted: Callable[[], bool]) -> None:
        """One turn: run the tasks that can go on, then wait for libcurl, a timer or
        :meth:`wake`, at most ``timeout_s``. ``wanted`` is asked once the loop would sleep:
        True (work came meanwhile) skips the wait."""
        self._fire_timers()
        self._run_ready()
        self._reap()
        if self._ready:
            return
        wait_s = timeout_s
        if self._timers:
            wait_s = min(wait_s, self._timers[0][0] - time.monotonic())
        curl_ms = self._multi.timeout()
        if curl_ms >= 0:
            wait_s = min(wait_s, curl_ms / 1000)
        if wait_s > 0:
            self.asleep = True
            try:
                if wanted():
                    return
                readers, writers, errors = self._multi.fdset()
                ready, _, _ = select.select([*readers, self._wake_in], writers, errors, wait_s)
            finally:
                self.asleep = False
            if self._wake_in in ready:
                self._drain_wake()
        self._reap()
        self._fire_timers()

    # -- what a task calls (through the module functions) ------------------------------------
    def _perform(self, curl: pycurl.Curl, task: _Task) -> None:
        self._multi.add_handle(curl)
        self._transfers[curl] = task
        error = self._hub.switch()
        if error is not None:
            raise error

    def _sleep(self, seconds: float, task: _Task) -> None:
        heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._seq), task))
        self._hub.switch()

    # -- internals ---------------------------------------------------------------------------
    def _guarded(self, run: Callable[..., object]) -> Callable[..., None]:
        def task_main(*args: Any) -> None:
            try:
                run(*args)
            except Exception:  # noqa: BLE001 - a task's bug must not stop the loop
                logger.exception("a fetch task failed")
            finally:
                self.tasks -= 1
        return task_main

    def _run_ready(self) -> None:
        ready = self._ready
        while ready:
            task, value = ready.popleft()
            if not task.dead:
                task.switch(*value)

    def _reap(self) -> None:
        """Let libcurl move every transfer on; queue the tasks whose transfer ended."""
        if not self._transfers:
            return
        multi = self._multi
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass  # libcurl < 7.20 asked to be called again at once; later ones never do
        while True:
            queued, done, failed = multi.info_read()
            for curl in done:
                multi.remove_handle(curl)
                self._ready.append((self._transfers.pop(curl), (None,)))
            for curl, code, message in failed:
                multi.remove_handle(curl)
                self._ready.append((self._transfers.pop(curl), (pycurl.error(code, message),)))
            if not queued:
                return

    def _fire_timers(self) -> None:
        timers = self._timers
        if not timers:
            return
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            self._ready.append((heapq.heappop(timers)[2], (None,)))

    def _drain_wake(self) -> None:
        try:
            while self._wake_in.recv(4096):
                pass
        except BlockingIOError:
            return  # drained


def _loop_of(task: greenlet.greenlet) -> FetchLoop | None:
    return getattr(task, "loop", None)


def perform(curl: pycurl.Curl) -> None:
    """``curl.perform()``, run by the caller's loop when called in a loop's task."""
    task = greenlet.getcurrent()
    loop = _loop_of(task)
    if loop is None:
        curl.perform()
    else:
        loop._perform(curl, task)  # noqa: SLF001 - the loop's own entry for its tasks


def sleep(seconds: float, until: threading.Event | None = None) -> None:
    """Wait ``seconds`` (less once ``until`` is set); a loop's task lets the others run."""
    if seconds <= 0:
        return
    task = greenlet.getcurrent()
    loop = _loop_of(task)
    if loop is None:
        if until is None:
            time.sleep(seconds)
        else:
            until.wait(seconds)
        return
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (until is not None and until.is_set()):
            return
        loop._sleep(left if until is None else min(left, _EVENT_SLICE_S), task)  # noqa: SLF001
