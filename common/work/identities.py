"""Who a page is fetched as: its session's cookies, its proxy, a login first (docs/real-web.md).

The fetch step (common/work/steps/fetch.py) asks :meth:`Identities.begin` for the
:class:`~common.web.fetch.Identity` of a page and gives the answer back to
:meth:`Identities.settle`. What decides, per page, from its job's settings
(:meth:`~common.work.job_book.JobBook.settings_for`) and the first extraction rule matching its
URL (only when some rule has a ``cookies`` or ``proxies`` key: otherwise no rule is looked at):

* cookies (COOKIES_ENABLED, a rule's ``cookies: false``): the page's session and its jar
  (common/web/sessions.py): without a pool the admit script brought the jar with the page's
  turn (:meth:`Identities.jar_to_read`), with one a round trip opens a slot; a page that set no
  cookie writes nothing back;
* the proxy (PROXY_URLS, a job's ``proxies.urls``, a rule's ``proxies``; ``false``: direct):
  :class:`~common.web.proxies.ProxyPool` chooses, sticky to the session under
  PROXY_ROTATION=session; a ``proxy`` fetch error rests it (the URL is retried, the kind is
  transient), an answer counts it served;
* a login (SESSION_LOGIN, a job's ``session.login``), for the sessions of its URL's site (and
  its subdomains; the job's other sites are not logged in): a session whose jar has no login
  yet is logged in, once, by the worker that takes ``session_login_key`` (SET NX PX); the others park
  their URL for LOGIN_BUSY_MS meanwhile, as robots.txt's lock does. The login's state is a meta
  field of the jar, so it is read with it and goes when the session is retired. A login the
  site refuses (:class:`~common.web.login.LoginFailed`) dead-letters the page ``login_failed``
  with the reason, and so every page of that session for LOGIN_RETRY_S (the login is not tried
  again per page with credentials that failed; changing the spec tries at once); a login whose
  fetch failed transiently retries the page (``fetch_{kind}``).

With a pool (SESSION_POOL_SIZE), an answer whose status is in SESSION_RETIRE_STATUSES retires
the session and parks the URL to be tried again on another, counting ``session_retires`` in
the message (kept on re-publish; MAX_RETRIES is not spent): after SESSION_MAX_RETIRES the
status is the page's outcome as it would be without a pool. Cookie values never reach a log,
a record or a dead-letter header: only cookie names, counts and session names do. Counted in
``stats:counters``: ``sessions_retired``, ``session_logins``, ``session_logins_failed``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import redis

from common.core.config import Settings
from common.core.errors import ConfigError, FetchError
from common.core.urls import domain_of
from common.jobs.spec import DEFAULT_JOB
from common.store.keys import COUNTERS, cookie_jar_key, session_login_key
from common.web import multi
from common.web.fetch import Fetcher, FetchResult
from common.web.identity import Identity
from common.web.login import LoginFailed, LoginSpec, log_in, parse_login
from common.web.proxies import ProxyPool, parse_proxy_urls
from common.web.sessions import Session, SessionPool
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Failure, Park, Retry
from common.work.rule_lookup import RuleLookup
from common.work.rules_file import Rule

if TYPE_CHECKING:
    from common.work.steps.trip import Trip
__all__ = ["Identities", "Visit"]

logger = logging.getLogger(__name__)

LOGIN_FIELD = "!login"  # the jar's meta field: {"spec": digest, "ok": bool, "at": s, "why"}
LOGIN_BUSY_MS = 500  # another worker is logging the session in: look again this much later
LOGIN_RETRY_S = 300.0  # a failed login is not tried again for the same session before this
RETIRED_PARK_MS = 100  # a URL whose session was retired: tried again (on another) this soon
RETIRES_FIELD = "session_retires"  # the message's count of sessions its answers retired


@dataclass(slots=True)
class Visit:
    """What :meth:`Identities.begin` chose for a page, for :meth:`Identities.settle`."""

    settings: Settings
    session: Session | None
    proxy: str | None


class Identities:
    """The fetch step's sessions, proxies and logins; one per processor, shared by its loops."""

    def __init__(self, settings: Settings, client: redis.Redis, jobs: JobBook,
                 fetcher: Fetcher) -> None:
        self.client = client
        self.jobs = jobs
        self.fetcher = fetcher  # a login's fetches
        self.worker_id = settings.worker_id
        self.lock_ms = int(max(settings.fetch_total_timeout_s, 1.0) * 3 * 1000)
        self.sessions = SessionPool(client)
        self.proxies = ProxyPool(settings, client)
        self._rules = RuleLookup(lambda r: r.cookies is not None or r.proxies is not None)
        self._lists: dict[str, tuple[str, ...]] = {}  # PROXY_URLS -> the parsed list
        self._logins: dict[str, LoginSpec | Failure] = {}  # SESSION_LOGIN -> the spec
        try:  # the fleet's own values: a mistake stops the worker at start
            self._proxy_list(settings.proxy_urls)
        except ValueError as exc:
            raise ConfigError(f"PROXY_URLS: {exc}") from None
        if isinstance(spec := self._login_spec(settings.session_login), Failure):
            raise ConfigError(f"SESSION_LOGIN: {spec.error}")

    def jar_to_read(self, trip: Trip) -> str | None:
        """The cookie jar the admit script reads with ``trip``'s turn (``trip.domain`` set):
        its session's when it has cookies and no pool, else None (a pooled session's slot is
        chosen in :meth:`begin`'s own round trip)."""
        settings = self.jobs.settings_for(trip.job)
        if not settings.cookies_enabled or settings.session_pool_size > 0:
            return None
        rule = self._rule(settings, trip.url)
        if rule is not None and rule.cookies is False:
            return None
        return cookie_jar_key(trip.job.name if trip.job is not None else DEFAULT_JOB,
                              trip.domain, "0.0")

    def begin(self, trip: Trip) -> tuple[Identity, Visit] | Park | Retry | DeadLetter | None:
        """The identity to fetch ``trip``'s page with (None: no cookies, no proxy: nothing
        to settle), or why it cannot be fetched now (a login elsewhere, a failed login)."""
        settings = self.jobs.settings_for(trip.job)
        rule = self._rule(settings, trip.url)
        cookies = settings.cookies_enabled and (rule is None or rule.cookies is not False)
        if rule is not None and rule.proxies is not None:
            proxies = rule.proxies
        else:
            try:
                proxies = self._proxy_list(settings.proxy_urls)
            except ValueError as exc:  # a job's (its submission checks them: an older job)
                return DeadLetter(Failure("job_settings_invalid", error=f"PROXY_URLS: {exc}"))
        if not cookies and not proxies:
            return None
        session = None
        if cookies:
            with multi.yielding():  # the loop's other tasks run while Redis answers
                session = self.sessions.open(
                    trip.job.name if trip.job is not None else DEFAULT_JOB, trip.domain,
                    pool_size=settings.session_pool_size, max_uses=settings.session_max_uses,
                    max_cookies=settings.cookie_jar_max_cookies,
                    max_bytes=settings.cookie_jar_max_bytes,
                    preloaded=trip.admission.jar if trip.admission is not None else None)
        sticky = session.key if session is not None and \
            settings.proxy_rotation == "session" else None
        proxy = self.proxies.choose(proxies, sticky) if proxies else None
        identity = Identity(session.jar if session is not None else None, proxy)
        visit = Visit(settings, session, proxy)
        if session is not None and settings.session_login and \
                self._logs_in(settings.session_login, trip.domain):
            end = self._log_in(visit, identity)
            if end is not None:
                return end
        return identity, visit

    def settle(self, trip: Trip, visit: Visit, response: FetchResult | None,
               error: FetchError | None = None) -> Park | None:
        """After the fetch: the proxy counted (or rested), the jar saved if the page changed
        it, or the session retired and the URL parked for another (see the module doc)."""
        if visit.proxy is not None:
            if error is not None and error.kind == "proxy":
                self.proxies.failed(visit.proxy)
            elif error is None:
                self.proxies.served(visit.proxy)
        session, settings = visit.session, visit.settings
        if session is None:
            return None
        if response is not None and session.pooled and \
                response.status in settings.session_retire_statuses:
            retires = trip.message.extra.get(RETIRES_FIELD, 0)
            retires = retires if type(retires) is int and retires >= 0 else 0
            if retires < settings.session_max_retires:
                with multi.yielding():
                    retired = self.sessions.retire(session)
                logger.info("session %s of %s retired after HTTP %d on %s (%s)", session.name,
                            session.site, response.status, trip.url,
                            "now" if retired else "already")
                message = replace(trip.message, extra={**trip.message.extra,
                                                       RETIRES_FIELD: retires + 1})
                return Park(RETIRED_PARK_MS, f"session retired (HTTP {response.status})",
                            message)
        with multi.yielding():
            self.sessions.save(session)
        return None

    def flush(self) -> None:
        """The worker stops: the proxies' buffered counters go to Redis."""
        self.proxies.flush()

    # -- per page ------------------------------------------------------------------------------
    def _rule(self, settings: Settings, url: str) -> Rule | None:
        """The first extraction rule matching ``url``, if any rule says who to fetch as."""
        return self._rules.match(settings, url)

    def _proxy_list(self, raw: str) -> tuple[str, ...]:
        """The proxies of a PROXY_URLS value; ValueError (redacted) when one is not one."""
        urls = self._lists.get(raw)
        if urls is None:
            urls = self._lists[raw] = parse_proxy_urls(raw)
        return urls

    def _login_spec(self, raw: str) -> LoginSpec | Failure | None:
        if not raw:
            return None
        spec = self._logins.get(raw)
        if spec is None:
            try:
                spec = parse_login(raw)
            except (ConfigError, ValueError) as exc:
                spec = Failure("job_settings_invalid", error=f"session login: {exc}")
            self._logins[raw] = spec
        return spec

    def _logs_in(self, raw: str, site: str) -> bool:
        """Whether a login applies to ``site``'s sessions: its URL's site, a subdomain of it
        or a domain it is a subdomain of (a login at auth.shop.example for shop.example, one at
        shop.example for www.shop.example); the job's other sites are crawled without
        logging in. A spec that cannot be read: True
        (the page is dead-lettered saying why)."""
        spec = self._login_spec(raw)
        if not isinstance(spec, LoginSpec):
            return True
        home = domain_of(spec.url)
        return site == home or site.endswith("." + home) or home.endswith("." + site)

    def _log_in(self, visit: Visit, identity: Identity) -> Park | Retry | DeadLetter | None:
        """None once the session is logged in (by this worker now, or any before)."""
        session, raw = visit.session, visit.settings.session_login
        spec = self._login_spec(raw)
        if isinstance(spec, Failure):
            return DeadLetter(spec)
        digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
        state = _login_state(session.jar.meta.get(LOGIN_FIELD))
        if state.get("spec") == digest:
            if state.get("ok") is True:
                return None
            if time.time() - float(state.get("at", 0)) < LOGIN_RETRY_S:
                return DeadLetter(Failure("login_failed", error=str(state.get("why", ""))))
        lock = session_login_key(session.job, session.site, session.name)
        if not self.client.set(lock, self.worker_id, nx=True, px=self.lock_ms):
            return Park(LOGIN_BUSY_MS, "session login in progress")
        try:
            # The jar was read before the lock: another worker may have logged the session in
            # and let go of the lock since. Its login (and cookies) are read again on return.
            fresh = self.client.hget(session.jar_key, LOGIN_FIELD)
            fresh_state = _login_state(fresh.decode() if fresh is not None else None)
            if fresh_state.get("spec") == digest and fresh_state.get("ok") is True:
                return Park(LOGIN_BUSY_MS, "session logged in meanwhile")
            try:
                log_in(self.fetcher, identity, spec)
            except LoginFailed as exc:
                why = str(exc)
                logger.warning("session %s of %s: %s", session.name, session.site, why)
                self._save_login(session, {"spec": digest, "ok": False, "at": time.time(),
                                           "why": why})
                self.client.hincrby(COUNTERS, "session_logins_failed", 1)
                return DeadLetter(Failure("login_failed", error=why))
            except FetchError as exc:
                if exc.kind == "proxy" and visit.proxy is not None:
                    self.proxies.failed(visit.proxy)
                self._save_login(session, None)  # what the hops set before it failed
                failure = Failure(f"fetch_{exc.kind}", error=f"{exc.kind}: login: {exc}")
                return Retry(failure) if exc.transient else \
                    DeadLetter(Failure("login_failed", error=failure.error))
            self._save_login(session, {"spec": digest, "ok": True, "at": time.time()})
            self.client.hincrby(COUNTERS, "session_logins", 1)
            logger.info("session %s of %s logged in", session.name, session.site)
            return None
        finally:
            self.client.delete(lock)

    def _save_login(self, session: Session, state: dict[str, object] | None) -> None:
        meta = {LOGIN_FIELD: json.dumps(state)} if state is not None else None
        with multi.yielding():
            self.sessions.save(session, meta)
        if meta:
            session.jar.meta.update(meta)


def _login_state(raw: str | None) -> dict[str, object]:
    if not raw:
        return {}
    try:
        state = json.loads(raw)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}
