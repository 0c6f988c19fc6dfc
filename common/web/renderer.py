"""Rendering from any thread, or from a fetch loop's task without stalling the loop.

A :class:`~common.web.browser.Browser` is Playwright's sync API: it belongs to the thread that
started it, and a render blocks that thread for the whole page (~260 ms). A worker's fetches
run as greenlet tasks of one :class:`~common.web.multi.FetchLoop` thread, so a render called
there would hold every other fetch of the loop. A :class:`Renderer` owns N browser threads,
each with a Browser of its own, serving render jobs from one shared queue. The caller hands a
job over and waits:

* in a loop's task, on the read end of a pipe made for the job (:func:`multi.wait_fd`), which
  the browser thread writes one byte to when the job is done: the loop runs its other tasks
  meanwhile;
* elsewhere, on the job's ``threading.Event``.

A render that overruns RENDER_TIMEOUT_S plus :data:`MARGIN_S` is abandoned by its caller as a
``timeout`` (the browser thread's own deadline closes the page). A browser whose Chromium died
fails the job it was rendering as ``connection`` (retried) and is replaced at the next job; a
browser thread that died is started again at the next :meth:`Renderer.render`.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.core.errors import FetchError
from common.core.redact import redact_url
from common.web import multi
from common.web.browser import Browser
from common.web.fetch import FetchResult
from common.web.identity import Identity
from common.web.render_result import CONTENT_TYPE, rendered_exchange, subrequests

logger = logging.getLogger(__name__)

#: Past the browser's own deadline, how long a caller waits before it gives up on a render
#: (a browser launch or a page close can take a few seconds on a loaded machine).
MARGIN_S = 10.0
#: Browsers failing in a row (to start, or dying) before the pool reports itself unhealthy.
BROKEN_AFTER = 3
#: How long close() waits for a browser thread before it kills that thread's Chromium.
_CLOSE_WAIT_S = 10.0
#: A refused request's URL in the render's log line is cut to this.
_LOG_URL_CHARS = 200


@dataclass
class _Job:
    """One render: filled in by a browser thread, waited for by its caller."""

    url: str
    wait_for: str | None
    scroll: int = 0
    identity: Identity | None = None  # the page's cookies and proxy
    wake_fd: int | None = None  # the pipe's write end, for a caller in a loop's task
    result: FetchResult | None = None
    error: FetchError | None = None
    abandoned: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self) -> None:
        """Mark done and wake the caller (unless it gave up and closed its pipe)."""
        with self.lock:
            self.done.set()
            if self.wake_fd is not None and not self.abandoned:
                os.write(self.wake_fd, b"\0")

    def abandon(self) -> None:
        """The caller stops waiting: the browser thread must not touch the pipe any more."""
        with self.lock:
            self.abandoned = True


class _Slot:
    """A browser thread and what it holds (its Browser, the job it renders)."""

    def __init__(self, renderer: Renderer, index: int) -> None:
        self.renderer = renderer
        self.index = index
        self.browser: Browser | None = None
        self.job: _Job | None = None
        self.thread = threading.Thread(target=self._run, name=f"renderer-{index}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        jobs = self.renderer._jobs  # noqa: SLF001 - the renderer's own queue
        try:
            while True:
                job = jobs.get()
                if job is None:
                    return
                if job.abandoned:
                    continue  # its caller gave up while it waited in the queue
                self.job = job
                try:
                    self._serve(job)
                finally:
                    self.job = None
                    job.finish()
        finally:
            self._drop_browser()

    def _serve(self, job: _Job) -> None:
        sent_at = time.time()
        try:
            if self.browser is not None and _disconnected(self.browser):
                self._drop_browser()  # Chromium went away between jobs
            if self.browser is None:
                self.browser = self.renderer._new_browser()  # noqa: SLF001
            extra = {k: v for k, v in (("scroll", job.scroll), ("identity", job.identity)) if v}
            rendered = self.browser.render(job.url, wait_for=job.wait_for, **extra)
        except FetchError as exc:
            job.error = FetchError(str(exc), kind=exc.kind, sent_at=sent_at)
            if exc.kind == "connection" and _disconnected(self.browser):
                logger.warning("renderer %d: the browser died rendering %s; replacing it",
                               self.index, job.url)
                self._drop_browser()
                self.renderer.broke(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a broken browser must not end the thread
            logger.exception("renderer %d: rendering %s failed", self.index, job.url)
            job.error = FetchError(f"{job.url}: the browser failed ({type(exc).__name__}: "
                                   f"{exc})", kind="connection", sent_at=sent_at)
            self._drop_browser()
            self.renderer.broke(f"{type(exc).__name__}: {exc}")
            return
        self.renderer.broken = 0  # a browser rendered a page
        refused = rendered.refused
        if refused:
            logger.info("render %s: %d request(s) refused: %s", job.url[:_LOG_URL_CHARS],
                        len(refused), "; ".join(f"{url[:_LOG_URL_CHARS]} ({why})"
                                                for url, why in refused))
        full = rendered.html.encode("utf-8")
        cap = self.renderer.max_body_bytes
        body = full[:cap] if cap else full
        proxy = job.identity.proxy if job.identity is not None else None
        job.result = FetchResult(
            url=job.url, final_url=rendered.final_url, status=rendered.status,
            content_type=CONTENT_TYPE, body=body,
            elapsed_ms=rendered.elapsed_ms, truncated=len(full) > len(body),
            headers=rendered.headers, sent_at=sent_at, http_version=None, remote_ip=None,
            proxy=redact_url(proxy) if proxy else None, rendered=True,
            cookies_sent=job.identity is not None and job.identity.cookies is not None,
            subrequests=subrequests(job.url, rendered.requests),
            exchanges=(rendered_exchange(rendered.final_url, rendered.status, body, sent_at),)
            if self.renderer.archive else ())

    def _drop_browser(self) -> None:
        browser, self.browser = self.browser, None
        if browser is not None:
            try:
                browser.close()
            except Exception:  # noqa: BLE001 - its processes are killed below all the same
                logger.exception("renderer %d: closing its browser failed", self.index)
                _kill_groups(browser.groups)

    def kill_browser(self) -> None:
        """From another thread: kill this slot's Chromium (its render fails, the thread goes
        on and replaces it)."""
        browser = self.browser
        if browser is not None:
            _kill_groups(browser.groups)


class Renderer:
    """N browser threads rendering jobs handed over from any thread or loop task.

    Args:
        settings: BROWSER_EXECUTABLE, FETCH_ALLOW_NETWORKS, RENDER_* and MAX_BODY_BYTES.
        threads: browsers rendering at once (each a thread and a Chromium).
        browser_factory: makes a thread's browser (default ``Browser.from_settings``).
    """

    def __init__(self, settings: Any, threads: int = 1, *,
                 browser_factory: Callable[[], Browser] | None = None) -> None:
        if threads < 1:
            raise ValueError(f"a renderer needs at least one thread, not {threads}")
        self.settings = settings
        self.timeout_s = float(settings.render_timeout_s)
        self.max_body_bytes = int(getattr(settings, "max_body_bytes", 0) or 0)
        self.archive = getattr(settings, "archive", "none") == "warc"  # an Exchange per page
        self._factory = browser_factory or (lambda: Browser.from_settings(settings))
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.broken = 0  # browsers in a row that failed to start or died (see health)
        self.broken_why = ""
        self._slots = [_Slot(self, index) for index in range(threads)]

    def _new_browser(self) -> Browser:
        return self._factory()

    @property
    def groups(self) -> set[int]:
        """The process groups of every browser running now."""
        return {group for slot in self._slots if slot.browser is not None
                for group in slot.browser.groups}

    def snapshot(self) -> dict[str, Any]:
        """The pool, for the heartbeat and /healthz: threads alive, browsers running, pages
        rendered by the running browsers, launches so far, their memory (PSS, MiB)."""
        slots = list(self._slots)
        browsers = [slot.browser for slot in slots if slot.browser is not None]
        return {"threads": len(slots),
                "alive": sum(1 for slot in slots if slot.thread.is_alive()),
                "browsers": len(browsers),
                "pages": sum(b.pages for b in browsers),
                "launches": sum(b.launches for b in browsers),
                "memory_mb": round(sum(b.memory_bytes() for b in browsers) / 2**20, 1),
                "closed": self._closed}

    def broke(self, why: str) -> None:
        """A browser failed to start or died: one more in a row (a render resets the count)."""
        self.broken += 1
        self.broken_why = why.splitlines()[0][:300] if why else "unknown"

    def health(self) -> tuple[bool, str]:
        """(healthy, the pool in a line): unhealthy once closed, when no browser thread lives,
        or when the last BROKEN_AFTER browsers failed to start or died without a render (a
        missing library, a crashing Chromium: the worker would only dead-letter pages)."""
        pool = self.snapshot()
        line = (f"render pool {pool['alive']}/{pool['threads']} threads, {pool['browsers']} "
                f"browsers, {pool['pages']} pages, {pool['launches']} launches, "
                f"{pool['memory_mb']} MiB")
        if self.broken >= BROKEN_AFTER:
            return False, f"{line}; {self.broken} browsers in a row failed: {self.broken_why}"
        return pool["alive"] > 0 and not pool["closed"], line

    def kill_browsers(self) -> None:
        """Kill every browser's Chromium now (tests; a hung renderer): their renders fail."""
        for slot in self._slots:
            slot.kill_browser()

    def render(self, url: str, *, wait_for: str | None = None, scroll: int = 0,
               identity: Identity | None = None) -> FetchResult:
        """Render ``url`` in one of the browser threads and return it as a fetch result.

        Called in a :class:`~common.web.multi.FetchLoop` task, the loop's other tasks run
        while the page renders; elsewhere the calling thread waits.

        Raises:
            FetchError: the browser's (``timeout``, ``blocked``, ``invalid``, ``connection``),
                ``timeout`` past RENDER_TIMEOUT_S + MARGIN_S, ``connection`` when closed.
        """
        self._restart_dead_threads()
        read_fd, write_fd = os.pipe()
        job = _Job(url, wait_for, scroll, identity, wake_fd=write_fd)
        try:
            self._jobs.put(job)
            deadline = time.monotonic() + self.timeout_s + MARGIN_S
            while not job.done.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    job.abandon()
                    raise FetchError(f"{url}: no render within {self.timeout_s + MARGIN_S:g} s",
                                     kind="timeout")
                if not multi.wait_fd(read_fd, left):
                    job.done.wait(left)  # not in a loop's task: this thread waits
        finally:
            job.abandon()
            os.close(read_fd)
            os.close(write_fd)
        if job.error is not None:
            raise job.error
        if job.result is None:
            raise FetchError(f"{url}: the renderer closed before rendering it",
                             kind="connection")
        return job.result

    def _restart_dead_threads(self) -> None:
        with self._lock:
            if self._closed:
                raise FetchError("the renderer is closed", kind="connection")
            for index, slot in enumerate(self._slots):
                if not slot.thread.is_alive():
                    logger.warning("renderer %d: its thread died; starting another", index)
                    slot._drop_browser()  # noqa: SLF001 - Chromium it left, if any
                    self._slots[index] = _Slot(self, index)

    def close(self) -> None:
        """Stop the threads and close every browser: no Chromium is left running. Jobs still
        waiting fail as ``connection``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _slot in self._slots:
            self._jobs.put(None)
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for slot in self._slots:
            slot.thread.join(max(deadline - time.monotonic(), 0.1))
            if slot.thread.is_alive():
                logger.warning("renderer %d: still rendering after %g s; killing its browser",
                               slot.index, _CLOSE_WAIT_S)
                slot.kill_browser()
                slot.thread.join(_CLOSE_WAIT_S)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.finish()  # no result: its caller raises "closed"

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _disconnected(browser: Browser | None) -> bool:
    """Whether a browser's Chromium was launched and is gone (replace the browser)."""
    return browser is not None and browser.gone


def _kill_groups(groups: set[int]) -> None:
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            logger.debug("process group %d already gone", group)
