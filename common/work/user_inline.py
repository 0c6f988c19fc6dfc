"""HANDLER_ISOLATION=inline: user code on the worker's own tree, in the fetch loop's thread.

No child process, no second parse, no pipe: a page costs what the handler costs (the bench's
extract phase has the figures). The price is the guarantees of the child (NOTES #36):

* a call over HANDLER_TIMEOUT_S gets :class:`CallTimedOut` raised inside it (CPython's
  ``PyThreadState_SetAsyncExc``, from one watchdog thread per process): pure-Python loops and
  slow code stop at their next bytecode, and the page records ``timeout:``. Code blocked in C
  (a catastrophic ``re`` pattern, a long ``time.sleep``) is not interrupted: the stuck-page
  watch ends the worker after STUCK_PAGE_S and the URL ends as ``poison`` after
  POISON_DELIVERIES, so nothing is lost, but the worker restarts;
* there is no memory limit of its own: a handler allocating past the container's limit takes
  the worker with it (again ending as poison);
* the handler sees the worker's tree: code that changes it changes the page's links.

For code you trust and measured; the default, ``process``, isolates each call.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import threading
import time
from typing import Any

from lxml import etree

from common.work.user_code import answer, load_user_code

__all__ = ["CallTimedOut", "InlineCode"]

logger = logging.getLogger(__name__)


class CallTimedOut(BaseException):  # noqa: N818 - not an Exception: handlers' `except Exception` miss it
    """Raised inside user code that ran past HANDLER_TIMEOUT_S (inline only)."""


class InlineCode:
    """The user code loaded in this process and a watchdog that stops calls past the time."""

    def __init__(self, kind: str, value: str, timeout_s: float) -> None:
        self.code = load_user_code(kind, value)
        self.timeout_s = timeout_s
        self._watch = _Watchdog()

    def run(self, head: dict[str, Any], body: bytes, root: etree._Element,
            base_url: str) -> dict[str, Any] | None:
        """The answer of common/work/user_code.py's :func:`answer`, or None when the call
        was stopped past the time limit."""
        token = self._watch.arm(self.timeout_s)
        try:
            try:
                return answer(self.code, head, body, root, base_url)
            finally:
                self._watch.disarm(token)
        except CallTimedOut:
            return None


class _Watchdog:
    """One thread raising :class:`CallTimedOut` in calls whose deadline passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int]] = []  # (deadline, token), a heap
        self._live: dict[int, int] = {}  # token -> thread id, while the call runs
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float) -> int:
        with self._cond:
            token = next(self._tokens)
            self._live[token] = threading.get_ident()
            heapq.heappush(self._due, (time.monotonic() + timeout_s, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="handler-watchdog",
                                                daemon=True)
                self._thread.start()
            elif self._due[0][1] == token:  # the earliest now: the watchdog waits less
                self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:  # under the lock: the watchdog cannot fire once this returned
            self._live.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._due and (self._due[0][0] <= now
                                     or self._due[0][1] not in self._live):
                    _deadline, token = heapq.heappop(self._due)
                    thread_id = self._live.pop(token, None)
                    if thread_id is not None:
                        _raise_in(thread_id)
                self._cond.wait(self._due[0][0] - now if self._due else None)


def _raise_in(thread_id: int) -> None:
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(CallTimedOut))
    if done != 1:
        logger.warning("could not stop a handler past its time (thread %d: %d)", thread_id,
                       done)
