"""The worker's robots.txt step: the rules of a URL's origin, fetched by one worker at a time.

:meth:`RobotsGate.rules` answers from the worker's memory (common/web/robots.py keeps the
parsed rules for a minute, Redis for ROBOTS_TTL_S), so the hot path costs no round trip. An
origin whose rules nobody has yet is fetched by the one worker that takes
``robots:lock:{origin}``; the others park their URL for ROBOTS_BUSY_MS. The robots.txt request
takes a rate-limit permit like any other request, and its answer tells the domain's throttle
what a page's would (common/web/throttle.py): a robots.txt answering 429, 503 or another
transient status (its ``Retry-After`` honoured) blocks the whole domain fleet-wide on the same
curve, a timeout slows it, a healthy answer counts as healthy. (The entry is still
"unavailable", RFC 9309: the origin's URLs are retried with backoff, and their turns wait for
the block to end.) A permanent fetch failure (an untrusted certificate...) is stored "failed"
for RETRY_BASE_S: the step dead-letters the origin's URLs ``fetch_{kind}`` meanwhile.
"""

from __future__ import annotations

from functools import partial

import redis

from common.core.config import Settings
from common.core.errors import TRANSIENT, FetchError, classify_status
from common.core.urls import domain_of
from common.store.marks import Permit, Retime
from common.web.fetch import Fetcher, FetchResult
from common.web.proxies import FleetProxies
from common.web.ratelimit import RateLimiter, retime_permit
from common.web.robots import RobotsRules, RobotsStore, origin_of
from common.work import metrics
from common.work.outcome import DeadLetter, Failure, Park

ROBOTS_BUSY_MS = 500  # another worker is fetching robots.txt: look again this much later


class RobotsGate:
    def __init__(self, settings: Settings, client: redis.Redis, limiter: RateLimiter,
                 fetcher: Fetcher) -> None:
        self.worker_id = settings.worker_id
        self.client = client
        self.limiter = limiter
        self.fetcher = fetcher  # reads at most MAX_ROBOTS_BYTES (robots_fetcher)
        self.proxies = FleetProxies(settings, client)  # PROXY_URLS: robots.txt goes that way
        self.store = RobotsStore.from_settings(client, settings)

    def rules(self, url: str) -> RobotsRules | Park | DeadLetter:
        """The rules for ``url``'s origin; else Park (another worker is fetching them, or the
        rate limit said not yet) or DeadLetter (``fetch_blocked``: the address guard refused
        the origin, whose pages it refuses too)."""
        origin = origin_of(url)
        rules = self.store.get(origin)
        if rules is not None:
            return rules
        if not self.store.try_lock(origin, self.worker_id):
            return Park(ROBOTS_BUSY_MS, "robots.txt being fetched")
        try:
            rules = self.store.get(origin)  # fetched by another worker since our first look
            if rules is not None:
                return rules
            domain = domain_of(origin)
            admission = self.limiter.admit(domain, self.limiter.rate_for(domain))
            metrics.show_throttle(domain, admission.throttle)
            if not admission.go:
                metrics.count_rate_limited(self.client)
                return Park(admission.wait_ms, "rate limit (robots.txt)")
            try:
                return self.store.refresh(origin, partial(self._fetch, admission.permit))
            except FetchError as exc:  # blocked: the page is on the same origin, refused too
                return DeadLetter(Failure("fetch_blocked", error=f"{exc.kind}: {exc}"))
        finally:
            self.store.unlock(origin)

    def _fetch(self, permit: Permit | None, url: str) -> FetchResult:
        """Fetch robots.txt (any content type): its permit moved to the send time, and the
        domain's throttle told how the site answered."""
        domain = domain_of(url)
        try:
            response = self.proxies.fetch(self.fetcher, url, accept_any_type=True)
        except FetchError as exc:
            self._report(url, Failure(f"fetch_{exc.kind}"), Retime(permit, exc.sent_at))
            raise
        if classify_status(response.status) == TRANSIENT:
            self._report(url, Failure(f"http_{response.status}", status=response.status,
                                      retry_after=response.headers.get("retry-after")),
                         Retime(permit, response.sent_at))
        else:
            self.limiter.throttle.observe(domain, response)
            self._report(url, None, Retime(permit, response.sent_at))
        return response

    def _report(self, url: str, failure: Failure | None, retime: Retime) -> None:
        pipe = self.client.pipeline(transaction=False)
        if failure is None:
            retime_permit(pipe, retime)
        else:
            self.limiter.report(pipe, url, failure, retime)
        if pipe.command_stack:
            pipe.execute()
