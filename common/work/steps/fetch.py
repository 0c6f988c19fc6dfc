"""Fetch: one GET, with the message's own headers under a revisit's conditional ones, as the
page's identity: its session's cookies and its proxy (common/work/identities.py).

Redirects on the URL's own origin that robots.txt allows are followed by the fetcher; any
other hop ends the fetch with the 3xx as its response (common/work/redirects.py). The
domain's throttle is told how the site answered (common/web/throttle.py). A fetch that fails
is retried (timeout, connection) or dead-lettered (blocked, too many redirects...) with its
permit re-timed to when the request was sent. A cached response is not fetched again.

In a render worker the page is loaded in Chromium instead (common/web/renderer.py), with the
options its message carries (what to wait for, how far to scroll); the requests it made to
its own site besides the page count against the site's rate limit.

Before the fetch the page's identity is chosen (a session login elsewhere parks the URL);
after it the jar is saved when the page changed it, and with a session pool a blocking
answer retires the session and parks the URL to be tried on another.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from common.core.errors import FetchError
from common.core.render_options import BadRenderOptions, RenderOptions, parse_render
from common.store.marks import Retime
from common.web.fetch import Fetcher
from common.web.ratelimit import RateLimiter
from common.web.renderer import Renderer
from common.web.robots import RobotsRules, origin_of
from common.work import metrics
from common.work.identities import Identities
from common.work.outcome import DeadLetter, Failure, Park, Retry
from common.work.revisit import request_headers
from common.work.steps.trip import Trip


def follow_rule(url: str, rules: RobotsRules | None) -> Callable[[str], bool]:
    """Which redirect hops of ``url``'s fetch the fetcher follows itself: those that stay on
    its origin and that robots.txt allows (nothing is computed until a redirect comes)."""
    return partial(_same_origin_allowed, url, rules)


def _same_origin_allowed(url: str, rules: RobotsRules | None, target: str) -> bool:
    return origin_of(target) == origin_of(url) and (rules is None or rules.allows(target))


class Fetch:
    def __init__(self, fetcher: Fetcher, limiter: RateLimiter,
                 identities: Identities | None = None, renderer: Renderer | None = None
                 ) -> None:
        self.fetcher = fetcher
        self.limiter = limiter
        self.identities = identities  # None: every page fetched as no one, directly
        self.renderer = renderer  # a render worker's browsers (None: fetched over HTTP)

    def fetch_page(self, trip: Trip) -> Park | Retry | DeadLetter | None:
        """Set ``trip.response`` and ``trip.retime``; retry or dead-letter a failed fetch."""
        if trip.cached:
            return None
        url = trip.url
        trip.progress.enter("fetch")
        options = None
        if self.renderer is not None:
            try:
                options = parse_render(trip.message.extra.get("render")) or RenderOptions()
            except BadRenderOptions as exc:
                return DeadLetter(Failure("bad_message", error=f"render: {exc}"))
        chosen = self.identities.begin(trip) if self.identities is not None else None
        if chosen is not None and not isinstance(chosen, tuple):
            return chosen  # a login elsewhere (park), or one that failed
        identity, visit = chosen if chosen is not None else (None, None)
        follow = follow_rule(url, trip.rules)
        headers = request_headers(trip.message, trip.headers)
        try:
            if options is None:
                response = self.fetcher.fetch(url, headers=headers, follow=follow,
                                              identity=identity)
            else:
                response = self.renderer.render(url, wait_for=options.wait_for,
                                                scroll=options.scroll, identity=identity)
        except FetchError as exc:
            if visit is not None:
                self.identities.settle(trip, visit, None, exc)
            retime = Retime(trip.admission.permit, exc.sent_at)
            failure = Failure(f"fetch_{exc.kind}", error=f"{exc.kind}: {exc}")
            return Retry(failure, retime) if exc.transient else DeadLetter(failure, retime)
        metrics.FETCH_SECONDS.observe(response.elapsed_ms / 1000)
        metrics.FETCH_BYTES.inc(len(response.body))
        self.limiter.throttle.observe(trip.domain, response)  # told at the next admit
        if response.subrequests:
            self.limiter.charge(trip.domain, response.subrequests)
        if visit is not None and (end := self.identities.settle(trip, visit, response)):
            return end  # its session retired: tried again on another (a 429 slowed it too)
        trip.response = response
        trip.retime = Retime(trip.admission.permit, response.sent_at)
        return None
