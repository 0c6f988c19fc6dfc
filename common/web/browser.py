"""Rendering a page in headless Chromium, every request it makes under the address guard.

The distribution's Chromium (BROWSER_EXECUTABLE) is driven by Playwright for Python through
``executable_path``; no browser is ever downloaded (``playwright install`` is never run).
Playwright documents that it supports only the Chromium builds it bundles: 1.65.2 is built for
Chromium 159, Debian ships 156. It speaks the DevTools protocol, so an older Chromium works as
long as the calls and launch switches it uses exist there; tests/web/test_browser.py, run against
the installed Chromium, is the check, to run again whenever either is upgraded.

Each render gets a fresh browser context (no cookies, cache or storage from another page), its
requests pass :func:`~common.web.browser_guard.refusal` in the page's interception, and every
connection Chromium opens goes through a :class:`~common.web.browser_guard.GuardProxy` (onward
through the page's own proxy when its Identity has one; counting the bytes the page receives
against RENDER_MAX_BYTES). The page's cookies are its Identity's jar, not Chromium's
(common/web/browser_page.py). The browser is closed and a fresh one launched every
RENDER_PAGES_PER_BROWSER pages, or after a page that left it above RENDER_MAX_BROWSER_MB (PSS);
closing it kills its process groups, so no Chromium outlives it.

Threads: Playwright's sync API runs its own event loop in greenlets of the thread that starts
it. A :class:`Browser` is used from one thread only, and never from a
:class:`~common.web.multi.FetchLoop` task (a greenlet of another loop): a render worker gives a
browser a thread of its own.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.core.errors import ConfigError, FetchError
from common.web import browser_page as in_page
from common.web.browser_guard import GuardProxy, refusal
from common.web.browser_page import RenderResult
from common.web.browser_procs import (
    chromium_pids,
    descendants,
    group_of,
    memory_bytes,
    pss_estimate,
)
from common.web.identity import CookieJar, Identity
from common.web.netguard import AddressGuard

if TYPE_CHECKING:
    from playwright.sync_api import Playwright, Request, Route, WebSocketRoute
# Playwright is imported by the first browser: a plain HTTP worker imports this module (NOTES #81).
sync_playwright: Any = None


class PlaywrightError(Exception):  # never raised: Playwright's own once a browser is made
    pass


PlaywrightTimeout: type[Exception] = PlaywrightError


def _load_playwright() -> None:
    """Playwright's entry point and errors, imported once (not installed: :func:`_driver`)."""
    global sync_playwright, PlaywrightError, PlaywrightTimeout  # noqa: PLW0603
    if sync_playwright is not None:
        return
    try:
        from playwright.sync_api import Error, TimeoutError
        from playwright.sync_api import sync_playwright as start
    except ImportError:  # the render extra is not installed: _driver() says so
        return
    PlaywrightError, PlaywrightTimeout, sync_playwright = Error, TimeoutError, start


logger = logging.getLogger(__name__)

#: Chromium's own traffic off (updates, safe browsing lists, sync, metrics, prefetching), and
#: nothing around the guard proxy (WebRTC's UDP). No ``--disable-features``: Chromium keeps the
#: last one given, and Playwright's own (network time, search preconnects, optimisation hints,
#: and the redirect fix its interception needs) must stay.
CHROMIUM_FLAGS = (
    "--headless=new", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-default-apps",
    "--disable-domain-reliability", "--no-pings", "--dns-prefetch-disable",
    "--disable-client-side-phishing-detection", "--metrics-recording-only",
    "--disable-breakpad", "--no-default-browser-check",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-dev-shm-usage",
)
_DOM_NODES_JS = "() => document.getElementsByTagName('*').length"
#: One Playwright driver per thread (its sync API allows no second one in a thread), shared by
#: that thread's browsers: [driver, users].
_drivers = threading.local()
#: Launches one at a time, so the Chromium processes that appear are the launching browser's.
_launching = threading.Lock()


def _driver() -> Playwright:
    _load_playwright()
    if sync_playwright is None:
        raise ConfigError("rendering needs Playwright: pip install playwright")
    if getattr(_drivers, "users", 0) == 0:
        _drivers.playwright = sync_playwright().start()
        _drivers.users = 0
    _drivers.users += 1
    return _drivers.playwright


def _release_driver() -> None:
    _drivers.users -= 1
    if _drivers.users == 0:
        _drivers.playwright.stop()
        _drivers.playwright = None


class Browser:
    """One Chromium, rendering pages one at a time, recycled every ``pages_per_browser``.

    Args:
        executable: the Chromium binary (BROWSER_EXECUTABLE).
        guard: the addresses its connections may go to (FETCH_ALLOW_NETWORKS).
        timeout_s: longest a render takes (RENDER_TIMEOUT_S).
        block_types: resource types refused (RENDER_BLOCK_TYPES).
        max_dom_nodes: a larger rendered DOM is refused (RENDER_MAX_DOM_NODES).
        pages_per_browser: renders before a fresh browser (RENDER_PAGES_PER_BROWSER).
        max_bytes: a page receiving more is stopped, ``too_large`` (RENDER_MAX_BYTES; 0: no cap).
        max_browser_mb: a browser above this PSS after a page is replaced
            (RENDER_MAX_BROWSER_MB; 0: never measured).
    """

    def __init__(self, executable: str, guard: AddressGuard, *, timeout_s: float = 30.0,
                 block_types: frozenset[str] = frozenset({"image", "font", "media"}),
                 max_dom_nodes: int = 200_000, pages_per_browser: int = 200,
                 max_bytes: int = 0, max_browser_mb: int = 0) -> None:
        self.executable = executable
        self.guard = guard
        self.timeout_s = timeout_s
        self.block_types = block_types
        self.max_dom_nodes = max_dom_nodes
        self.pages_per_browser = pages_per_browser
        self.max_bytes = max_bytes
        self.max_browser_mb = max_browser_mb
        self.memory_checks_us: list[float] = []  # what each memory check took (the last 100)
        self.launches = 0  # browsers started so far
        self.pages = 0  # pages rendered by the current browser
        self._proxy = GuardProxy(guard)
        self._playwright: Playwright | None = None
        self._browser: Any = None
        self._pids: set[int] = set()

    @classmethod
    def from_settings(cls, settings: Any) -> Browser:
        return cls(settings.browser_executable, AddressGuard(settings.fetch_allow_networks),
                   timeout_s=settings.render_timeout_s,
                   block_types=frozenset(t.strip() for t in settings.render_block_types.split(",")
                                         if t.strip()),
                   max_dom_nodes=settings.render_max_dom_nodes,
                   pages_per_browser=settings.render_pages_per_browser,
                   max_bytes=settings.render_max_bytes,
                   max_browser_mb=settings.render_max_browser_mb)

    # -- lifecycle ------------------------------------------------------------------------

    def _launch(self) -> Any:
        if self._playwright is None:
            self._playwright = _driver()
        # Chromium's own sandbox is off: Playwright passes --no-sandbox unless told
        # chromium_sandbox=True (its default), so the container (or the machine's user) is the
        # confinement; every connection is still the guard proxy's (docs/security.md).
        args = [*CHROMIUM_FLAGS, f"--proxy-server={self._proxy.url}",
                "--proxy-bypass-list=<-loopback>"]
        with _launching:
            before = chromium_pids()
            self._browser = self._playwright.chromium.launch(
                executable_path=self.executable, args=args, headless=True)
            # The leaders of the process groups the driver started Chromium in.
            self._pids = {pid for pid in chromium_pids() - before if group_of(pid) == pid}
        self.launches += 1
        self.pages = 0
        logger.info("browser %s launched (%s, pids %s)", self.executable,
                    self._browser.version, sorted(self._pids))
        return self._browser

    def _close_browser(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            try:
                browser.close()
            except PlaywrightError as exc:
                logger.warning("browser close failed: %s", exc)
        # The driver starts Chromium in a process group of its own: kill what is left of it.
        for pid in self._pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # already gone with browser.close()
        self._pids = set()

    @property
    def groups(self) -> set[int]:
        """The process groups of the current browser (Chromium's launch pid leads one)."""
        return set(self._pids)

    @property
    def gone(self) -> bool:
        """Its Chromium was launched and has gone away (replace the browser)."""
        return self._browser is not None and not self._browser.is_connected()

    def memory_bytes(self) -> int:
        """What the current browser's processes (renderers included) hold in memory (PSS)."""
        return memory_bytes(chromium_pids(self.groups)) if self._pids else 0

    def _recycle_if_big(self) -> None:
        """After a page: replace the browser when its memory is above ``max_browser_mb``
        (estimated from statm: its PSS takes 10-100 times longer to read, browser_procs)."""
        if not self.max_browser_mb or self._browser is None:
            return
        started = time.perf_counter()
        held = pss_estimate(descendants(self._pids))
        self.memory_checks_us = [*self.memory_checks_us[-99:],
                                 (time.perf_counter() - started) * 1e6]
        if held > self.max_browser_mb * 2**20:
            logger.info("browser holds %.0f MiB after %d pages, more than RENDER_MAX_BROWSER_MB "
                        "(%d): replacing it", held / 2**20, self.pages, self.max_browser_mb)
            self._close_browser()

    def close(self) -> None:
        """Close the browser, its driver and the guard proxy; no Chromium is left running."""
        self._close_browser()
        if self._playwright is not None:
            self._playwright = None
            _release_driver()
        self._proxy.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rendering ------------------------------------------------------------------------

    def render(self, url: str, *, wait_for: str | None = None, scroll: int = 0,
               identity: Identity | None = None) -> RenderResult:
        """Load ``url``, run its scripts, and return the DOM.

        Args:
            url: an http or https URL.
            wait_for: a CSS selector to wait for after the load (content filled in later).
            scroll: then scroll to the bottom up to this many times, while the page grows.
            identity: the page's cookie jar and proxy.

        Raises:
            FetchError: ``timeout`` past RENDER_TIMEOUT_S, ``invalid`` for a DOM over
                RENDER_MAX_DOM_NODES, ``too_large`` past RENDER_MAX_BYTES, ``blocked`` when
                the guard refuses the page itself, ``proxy`` when its proxy fails,
                ``connection`` when it cannot be loaded.
        """
        why = refusal(url, "document", self.guard)
        if why is not None:
            raise FetchError(f"{url}: {why}", kind="blocked")
        if self._browser is None or self.pages >= self.pages_per_browser:
            self._close_browser()
            self._launch()
        self.pages += 1
        started = time.monotonic()
        deadline_ms = self.timeout_s * 1000
        log: list[tuple[str, str, str]] = []
        refused_before = self._proxy.refused_count
        jar = identity.cookies if identity is not None else None
        self._proxy.begin_page(identity.proxy if identity is not None else None, self.max_bytes)
        context = self._browser.new_context(service_workers="block")
        try:
            context.route("**/*", lambda route, request: self._check(route, request, log,
                                                                      jar, context))
            context.route_web_socket("**", lambda ws: self._check_socket(ws, log))
            if jar is not None:
                context.on("response", lambda answer: in_page.keep_cookies(jar, answer))
            page = context.new_page()
            page.set_default_timeout(deadline_ms)
            response = page.goto(url, wait_until="commit", timeout=deadline_ms)
            # In slices, so a page past RENDER_MAX_BYTES stops at once, not at the deadline.
            end, over = started + self.timeout_s, self._cap_check(url)
            in_page.sliced(lambda ms: page.wait_for_load_state("load", timeout=ms), end, over,
                           PlaywrightTimeout)
            if wait_for is not None:
                in_page.sliced(lambda ms: page.wait_for_selector(wait_for, timeout=ms,
                                                                 state="attached"),
                               end, over, PlaywrightTimeout)
            scrolls = in_page.scroll_down(page, scroll, end, PlaywrightTimeout) if scroll else 0
            over()
            nodes = int(page.evaluate(_DOM_NODES_JS))
            if nodes > self.max_dom_nodes:
                raise FetchError(f"{url}: {nodes} DOM nodes, more than RENDER_MAX_DOM_NODES "
                                 f"({self.max_dom_nodes})", kind="invalid")
            html = page.content()
            self._raise_if_over_cap(url)
            # Connections no request announced (a redirect's later hops, preconnects).
            log.extend((target, "connection", "refused: by the guard proxy")
                       for target in self._proxy.refused_since(refused_before))
            return RenderResult(
                url=url, final_url=page.url, status=response.status if response else 0,
                html=html, elapsed_ms=(time.monotonic() - started) * 1000, requests=log,
                headers=in_page.response_headers(response), received_bytes=self._proxy.received,
                scrolls=scrolls)
        except PlaywrightTimeout:
            self._raise_if_over_cap(url)
            raise FetchError(f"{url}: not rendered within {self.timeout_s:g} s",
                             kind="timeout") from None
        except PlaywrightError as exc:
            self._raise_if_over_cap(url)
            raise in_page.failure(url, exc, self._proxy.refused_since(refused_before),
                                  list(self._proxy.proxy_errors)) from None
        finally:
            try:
                context.close()
            except PlaywrightError as exc:
                logger.warning("closing the context of %s failed: %s", url, exc)
            self._recycle_if_big()

    def _raise_if_over_cap(self, url: str) -> None:
        if self._proxy.over_cap:
            raise FetchError(f"{url}: the page received more than RENDER_MAX_BYTES "
                             f"({self.max_bytes} bytes)", kind="too_large")

    def _cap_check(self, url: str) -> Callable[[], None]:
        return lambda: self._raise_if_over_cap(url)

    def _check(self, route: Route, request: Request, log: list[tuple[str, str, str]],
               jar: CookieJar | None, context: Any) -> None:
        why = refusal(request.url, request.resource_type, self.guard, self.block_types)
        if why is None and self._proxy.over_cap:
            why = "the page is past RENDER_MAX_BYTES"
        log.append((request.url, request.resource_type,
                    "allowed" if why is None else f"refused: {why}"))
        if why is None:
            if jar is not None:
                in_page.load_cookies(jar, context, request.url)
            route.continue_()
        else:
            route.abort("blockedbyclient")

    def _check_socket(self, ws: WebSocketRoute, log: list[tuple[str, str, str]]) -> None:
        why = refusal(ws.url, "websocket", self.guard, self.block_types)
        log.append((ws.url, "websocket", "allowed" if why is None else f"refused: {why}"))
        if why is None:
            ws.connect_to_server()
        else:
            ws.close(code=1008, reason="refused by the address guard")

