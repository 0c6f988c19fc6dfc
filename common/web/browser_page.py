"""What a render does inside its page (common/web/browser.py): scrolling an endless listing,
the page's cookies kept in its own jar, the main document's headers, and a failure named.

Cookies: the page's cookies are its ``Identity.cookies`` jar, not Chromium's store. Chromium
overrides any Cookie header the interception sets, so before each request the interception
empties the context's store and loads it with the jar's cookies for that URL
(``jar.header_for``; host-only, SameSite left to Chromium's default, Lax); each response's
Set-Cookie lines go to the jar. The context is fresh per page: a cookie a script set, or one
from a response the jar refused, is gone at the next request. Limits: a redirect's later hops
(not intercepted) send what the store holds (the first hop's cookies and its Set-Cookie ones);
two requests of one page in flight at once may see each other's load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.core.errors import FetchError
from common.web.browser_guard import CHROMIUM_SERVICE_HOSTS
from common.web.identity import CookieJar

if TYPE_CHECKING:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import Response

logger = logging.getLogger(__name__)


@dataclass
class RenderResult:
    """A rendered page.

    Attributes:
        url: the URL asked for.
        final_url: where the page ended (after HTTP and script redirects).
        status: the HTTP status of the main document's last response.
        html: the DOM serialised after rendering.
        elapsed_ms: the whole render.
        requests: every request the page made, as (url, resource type, verdict); the verdict
            is ``allowed`` or ``refused: <reason>``.
        headers: the main document's response headers (lower-case names).
        received_bytes: what the page's connections received (RENDER_MAX_BYTES counts it).
        scrolls: the scrolls that made the document grow.
    """

    url: str
    final_url: str
    status: int
    html: str
    elapsed_ms: float
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    received_bytes: int = 0
    scrolls: int = 0

    @property
    def refused(self) -> list[tuple[str, str]]:
        """(url, reason) of each request the page was refused (Chromium's own calls not)."""
        return [(url, verdict.removeprefix("refused: ")) for url, _, verdict in self.requests
                if verdict != "allowed"
                and url.rpartition(":")[0].lower() not in CHROMIUM_SERVICE_HOSTS]


#: After a scroll, how long the document may stay as it was before the listing is taken as
#: complete (bounded by what is left of RENDER_TIMEOUT_S).
SCROLL_QUIET_MS = 1000
_SIZE_JS = ("() => [document.documentElement.scrollHeight,"
            " document.getElementsByTagName('*').length]")
_SCROLL_JS = "() => window.scrollTo(0, document.documentElement.scrollHeight)"
_GREW_JS = ("([height, nodes]) => document.documentElement.scrollHeight > height"
            " || document.getElementsByTagName('*').length > nodes")


#: The longest a wait runs before the page's byte cap is looked at again.
SLICE_MS = 200


def sliced(wait: Callable[[float], object], deadline: float, check: Callable[[], None],
           timeout_error: type[Exception]) -> None:
    """``wait(timeout_ms)`` in slices of :data:`SLICE_MS` until it returns, ``check()``
    (which raises to stop) between two; the slice that reaches ``deadline`` raises
    ``timeout_error``."""
    while True:
        check()
        left_ms = (deadline - time.monotonic()) * 1000
        try:
            wait(max(min(SLICE_MS, left_ms), 1))
            return
        except timeout_error:
            if left_ms <= SLICE_MS:
                raise


def scroll_down(page: Any, times: int, deadline: float, timeout_error: type[Exception]) -> int:
    """Scroll to the bottom up to ``times`` times, each time waiting until the document grows
    (height or element count) or stays still for :data:`SCROLL_QUIET_MS`; stop at the first
    scroll after which it did not grow, or at ``deadline`` (``time.monotonic()``). Returns the
    scrolls that made it grow."""
    grown = 0
    for _ in range(times):
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 1:
            break
        before = page.evaluate(_SIZE_JS)
        page.evaluate(_SCROLL_JS)
        try:
            page.wait_for_function(_GREW_JS, arg=before,
                                   timeout=max(min(SCROLL_QUIET_MS, left_ms), 1))
        except timeout_error:
            break  # still for a quiet time, or out of time: the listing is what it is
        grown += 1
    return grown


def keep_cookies(jar: CookieJar, response: Response) -> None:
    """Give the jar what ``response`` set (its Set-Cookie lines)."""
    values = [h["value"] for h in response.headers_array() if h["name"].lower() == "set-cookie"]
    if values:
        jar.receive(response.url, values)


def load_cookies(jar: CookieJar, context: Any, url: str) -> None:
    """Before a request to ``url``: Chromium's store holds the jar's cookies for it and no
    other. (Playwright cannot set a request's Cookie header: Chromium's store overrides it.)"""
    context.clear_cookies()
    header = jar.header_for(url) if url.lower().startswith(("http:", "https:")) else None
    if not header:
        return
    cookies = []
    for pair in header.split(";"):
        name, sep, value = pair.strip().partition("=")
        if sep and name:
            cookies.append({"name": name, "value": value, "url": url})
    if cookies:
        context.add_cookies(cookies)


def response_headers(response: Response | None) -> dict[str, str]:
    """The main document's response headers, lower-case names, repeats joined by ", " (as
    common/web/curl.py keeps them)."""
    headers: dict[str, str] = {}
    if response is None:
        return headers
    for item in response.headers_array():
        name, value = item["name"].lower(), item["value"]
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def failure(url: str, exc: PlaywrightError, refused: list[str],
            proxy_errors: list[str]) -> FetchError:
    """``proxy``: the page's proxy failed; ``blocked``: the guard refused the page (a hop, a
    document; not Chromium's own calls); ``invalid``: no page (a download); else
    ``connection``."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if proxy_errors and ("ERR_SOCKS_CONNECTION_FAILED" in text or "ERR_PROXY" in text
                         or "ERR_CONNECTION" in text or "ERR_EMPTY_RESPONSE" in text):
        return FetchError(f"{url}: {proxy_errors[-1]}", kind="proxy")
    refused = [t for t in refused if t.rpartition(":")[0].lower() not in CHROMIUM_SERVICE_HOSTS]
    if "ERR_BLOCKED_BY_CLIENT" in text or "ERR_SOCKS_CONNECTION_FAILED" in text and refused:
        targets = f" (refused: {', '.join(refused)})" if refused else ""
        return FetchError(f"{url}: refused by the address guard{targets}", kind="blocked")
    if "Download is starting" in text:
        return FetchError(f"{url}: not a page (the browser would download it)", kind="invalid")
    return FetchError(f"{url}: {text}", kind="connection")
