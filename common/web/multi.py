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
* :func:`sleep`: a timer (a rate-limit slot a few milliseconds away, a wait for Redis);
* :func:`wait_readable`, a socket with nothing to read yet, only inside :func:`yielding`: a
  Redis reply to the processor's two per-page scripts (common/work/loop_redis.py), so a loop
  parses one page while another task's script runs in Redis. Opt-in, because code that keeps
  state across a Redis call (a producer's publish-and-confirm) must not be interleaved.

Outside a loop's task (a producer's robots.txt, the sitemap tools, tests) all three block the
calling thread as ``curl.perform()``, ``time.sleep`` and a socket read do, so the code calling
them does not know which it runs under. Everything else a task does (other Redis calls,
parsing, publishing) runs to its end without a switch, so no lock is ever held across one and
thread locks stay correct. Why greenlets rather than asyncio: the processor stays the
synchronous code it is, with redis-py, pika and lxml as they are; only the three waits above
know about the loop.

The loop is libcurl's event-driven integration (``socket_action``): libcurl says which sockets
to watch and when its next timeout is (the socket and timer callbacks), the loop waits in one
``poll`` on those sockets and a wake-up socket, and tells libcurl which socket is ready, so only
that transfer's handle is worked on. ``poll`` has no descriptor limit (``select`` and libcurl's
``fdset`` leave out sockets numbered past 1,023). Another thread writes the wake-up socket
(:meth:`FetchLoop.wake`) only when the loop sleeps and has said it wants work.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import greenlet
import pycurl

logger = logging.getLogger(__name__)

#: Longest a task sleeps at once while it waits for an event (see :func:`sleep`).
_EVENT_SLICE_S = 0.25
#: What libcurl asks to watch a socket for (its socket callback), as poll() masks.
_WATCH = {pycurl.POLL_IN: select.POLLIN, pycurl.POLL_OUT: select.POLLOUT,
          pycurl.POLL_INOUT: select.POLLIN | select.POLLOUT}
_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP
_BROKEN = select.POLLERR | select.POLLNVAL


#: Finished tasks a loop keeps to run the next ones (a greenlet reused costs ~1.3 us, a new
#: one ~8.6 us, a fresh stack chunk's mmap and munmap and its page faults; NOTES #81).
_IDLE_TASKS = 64


class _Task(greenlet.greenlet):
    """A greenlet run by a :class:`FetchLoop`; ``loop`` is how the module's waits find it."""

    loop: FetchLoop | None = None
    yields = False  # inside yielding(): socket reads wait through the loop


class FetchLoop:
    """Runs tasks (greenlets) and their libcurl transfers and timers, in the thread that made it.

    ``max_connects``: the multi handle's connection cache (keep-alive connections kept idle).
    """

    def __init__(self, max_connects: int = 32) -> None:
        self._hub = greenlet.getcurrent()
        self._poller = select.poll()
        self._curl_due: float | None = None  # libcurl's next timeout (monotonic), if any
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connects)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._transfers: dict[pycurl.Curl, _Task] = {}
        self._readers: dict[int, tuple[_Task, float]] = {}  # fd -> task waiting, its deadline
        self._timers: list[tuple[float, int, _Task]] = []
        self._ready: collections.deque[tuple[_Task, tuple[Any, ...]]] = collections.deque()
        self._seq = itertools.count()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._wake_fd = self._wake_in.fileno()
        self._poller.register(self._wake_fd, select.POLLIN)
        self.asleep = False  # in poll, waiting: another thread must wake() it
        self.tasks = 0  # started and not finished
        self._idle: list[_Task] = []  # finished tasks waiting in _task_main for the next run

    def close(self) -> None:
        self._multi.close()
        self._wake_in.close()
        self._wake_out.close()

    def spawn(self, run: Callable[..., object], *args: Any) -> None:
        """Start ``run(*args)`` as a task at the loop's next turn (in a finished task's
        greenlet when one is idle)."""
        if self._idle:
            task = self._idle.pop()
        else:
            task = _Task(run=self._task_main, parent=self._hub)
            task.loop = self
        self.tasks += 1
        self._ready.append((task, ((run, args),)))

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
        self._curl_timeout()
        if self._ready:
            return
        wait_s = timeout_s
        now = time.monotonic()
        if self._timers:
            wait_s = min(wait_s, self._timers[0][0] - now)
        if self._curl_due is not None:
            wait_s = min(wait_s, self._curl_due - now)
        if self._readers:
            wait_s = min(wait_s, min(due for _task, due in self._readers.values()) - now)
        events: list[tuple[int, int]] = []
        if wait_s > 0:
            self.asleep = True
            try:
                if wanted():
                    return
                events = self._poller.poll(wait_s * 1000)
            finally:
                self.asleep = False
        else:
            events = self._poller.poll(0)
        for fd, event in events:
            if fd == self._wake_fd:
                self._drain_wake()
                continue
            if fd in self._readers:
                self._resume_reader(fd)
                continue
            flags = (pycurl.CSELECT_IN if event & _READABLE else 0) | (
                pycurl.CSELECT_OUT if event & select.POLLOUT else 0) | (
                pycurl.CSELECT_ERR if event & _BROKEN else 0)
            self._multi.socket_action(fd, flags)
        if events:
            self._collect()
        self._curl_timeout()
        self._fire_timers()
        if self._readers:
            now = time.monotonic()
            for fd in [fd for fd, (_task, due) in self._readers.items() if due <= now]:
                self._resume_reader(fd)  # its own read then waits out the socket's timeout

    # -- what a task calls (through the module functions) ------------------------------------
    def _perform(self, curl: pycurl.Curl, task: _Task) -> None:
        self._multi.add_handle(curl)  # libcurl sets a timeout of 0: started at the next turn
        self._transfers[curl] = task
        error = self._hub.switch()
        if error is not None:
            raise error

    def _wait_readable(self, fd: int, timeout_s: float, task: _Task) -> None:
        self._readers[fd] = (task, time.monotonic() + timeout_s)
        self._poller.register(fd, select.POLLIN)
        self._hub.switch()

    def _resume_reader(self, fd: int) -> None:
        task, _due = self._readers.pop(fd)
        self._poller.unregister(fd)
        self._ready.append((task, (None,)))

    def _sleep(self, seconds: float, task: _Task) -> None:
        heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._seq), task))
        self._hub.switch()

    # -- internals ---------------------------------------------------------------------------
    def _task_main(self, job: tuple[Callable[..., object], tuple[Any, ...]]) -> None:
        """A task's greenlet: runs ``job`` (``run, args``), then waits idle for the next one
        :meth:`spawn` hands it, unless enough are idle already (then it ends)."""
        task = greenlet.getcurrent()
        while True:
            run, args = job
            try:
                run(*args)
            except Exception:  # noqa: BLE001 - a task's bug must not stop the loop
                logger.exception("a fetch task failed")
            finally:
                self.tasks -= 1
            run = args = job = None  # an idle task holds nothing of its last run
            if len(self._idle) >= _IDLE_TASKS:
                return
            self._idle.append(task)
            job = self._hub.switch()  # spawn() resumes an idle task with its next run
            while not (type(job) is tuple and len(job) == 2):  # anything else is a stray wake
                logger.error("an idle fetch task was resumed with %r: it waits on", job)
                job = self._hub.switch()

    def _run_ready(self) -> None:
        ready = self._ready
        while ready:
            task, value = ready.popleft()
            if not task.dead:
                task.switch(*value)

    def _on_socket(self, what: int, fd: int, _multi: object, _data: object) -> None:
        """libcurl's socket callback: watch ``fd`` for what it says, or no longer."""
        if what == pycurl.POLL_REMOVE:
            try:
                self._poller.unregister(fd)
            except KeyError:
                logger.debug("libcurl removed socket %d, which was not watched", fd)
        else:
            self._poller.register(fd, _WATCH[what])

    def _on_timer(self, timeout_ms: int) -> None:
        """libcurl's timer callback: its next timeout in ``timeout_ms`` (-1: none)."""
        self._curl_due = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000

    def _curl_timeout(self) -> None:
        """Tell libcurl its timeout came, if it did (it also starts handles just added)."""
        due = self._curl_due
        if due is not None and due <= time.monotonic():
            self._curl_due = None
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
            self._collect()

    def _collect(self) -> None:
        """Queue the tasks whose transfer ended, with None or the transfer's error."""
        multi = self._multi
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


@contextlib.contextmanager
def yielding() -> Iterator[None]:
    """Within it, a loop's task lets the others run while it waits to read a socket
    (:func:`wait_readable`). The caller must hold no state another task could touch."""
    task = greenlet.getcurrent()
    if _loop_of(task) is None or task.yields:
        yield
        return
    task.yields = True
    try:
        yield
    finally:
        task.yields = False


def wait_readable(sock: socket.socket) -> None:
    """In a loop's task inside :func:`yielding`, wait until ``sock`` has something to read
    (or its timeout passed), letting the loop's other tasks run; elsewhere return at once (the
    caller's blocking read waits)."""
    task = greenlet.getcurrent()
    loop = _loop_of(task)
    if loop is not None and task.yields:
        timeout_s = sock.gettimeout()
        loop._wait_readable(sock.fileno(), 3600.0 if timeout_s is None else timeout_s,  # noqa: SLF001
                            task)


def wait_fd(fd: int, timeout_s: float) -> bool:
    """In a loop's task, wait until ``fd`` is readable or ``timeout_s`` passed, letting the
    loop's other tasks run, and return True; elsewhere return False at once (the caller waits
    its own way). For a pipe only this task reads (a user-code child's)."""
    task = greenlet.getcurrent()
    loop = _loop_of(task)
    if loop is None:
        return False
    loop._wait_readable(fd, max(timeout_s, 0.0), task)  # noqa: SLF001
    return True


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
