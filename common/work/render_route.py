"""Which pages a browser renders: decided before the fetch, and again after a plain read.

Before the fetch (the HTTP worker's Route step), a page goes to the render queue when:

1. its message says so (``render``: a handler's ``page.follow(url, render=True)``, a page
   sent on before), unless its rule says ``render: false``;
2. the first EXTRACT_RULES rule matching it says ``render: true`` or gives options;
3. RENDER is ``always`` (the fleet's, or its job's);
4. its domain was found to need a browser (RENDER=auto, or its rule's
   ``render.when_missing``) less than RENDER_DOMAIN_TTL_S ago (:class:`RenderDomains`).

After a plain read (the Shell step), a page goes there when its rule's
``render.when_missing`` selector is absent from it, or, with RENDER=auto, when it looks
like an empty JavaScript shell (:func:`looks_like_shell`); its domain is then marked, so
its later pages skip the plain fetch. Everything else stays on the HTTP path: no call to
Redis or to a browser is added to a plain page (the domains are read every
:data:`REFRESH_S`, the rules only when one has ``render``).
"""

from __future__ import annotations

import logging
import re
import threading
import time

import lxml.html
import redis
from lxml import etree

from common.core.config import Settings
from common.core.render_options import BadRenderOptions, RenderOptions, parse_render
from common.core.urls import domain_of
from common.jobs.registry import JobRef
from common.jobs.spec import DEFAULT_JOB
from common.store.keys import RENDER_DOMAINS
from common.work.job_book import JobBook
from common.work.rule_lookup import RuleLookup

logger = logging.getLogger(__name__)

#: How often a worker reads the marked domains again (a mark reaches every worker this late).
REFRESH_S = 5.0
#: A page with less visible text than this (characters, whitespace collapsed) that has a
#: script is a JavaScript shell. Measured (text_length as the record has it): a React root
#: with its noscript line 0, a Next.js shell 0, Angular's "Loading..." 10; the test site's
#: smallest plain pages 331-372, the bench farm's 22,898-23,146.
SHELL_TEXT_CHARS = 200
_SCRIPT = re.compile(rb"<script\b", re.IGNORECASE)


def looks_like_shell(text_length: int | None, body: bytes) -> bool:
    """Whether a plainly fetched HTML page looks like an empty JavaScript shell."""
    return text_length is not None and text_length < SHELL_TEXT_CHARS and bool(
        _SCRIPT.search(body))


class RenderDomains:
    """``render:domains`` (common/store/keys.py), read whole at most every REFRESH_S."""

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._until: dict[str, float] = {}
        self._read_at = 0.0
        self._lock = threading.Lock()

    def wants(self, job: str, site: str) -> bool:
        now = time.time()
        if now - self._read_at >= REFRESH_S:
            self._refresh(now)
        return self._until.get(f"{job}|{site}", 0.0) > now

    def mark(self, job: str, site: str) -> None:
        """``site``'s pages in ``job`` go straight to rendering for RENDER_DOMAIN_TTL_S; the
        entries whose time is over are removed meanwhile."""
        now = time.time()
        field = f"{job}|{site}"
        until = now + self.ttl_s
        stale = [f for f, t in self._until.items() if t <= now]
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(RENDER_DOMAINS, field, f"{until:.0f}")
        if stale:
            pipe.hdel(RENDER_DOMAINS, *stale)
        pipe.execute()
        with self._lock:
            self._until = {**{f: t for f, t in self._until.items() if t > now}, field: until}
        logger.info("%s in job %s needs a browser: its pages go to the render queue for %d s",
                    site, job, self.ttl_s)

    def _refresh(self, now: float) -> None:
        try:
            raw = self.client.hgetall(RENDER_DOMAINS)
        except redis.RedisError as exc:  # the pages go on as they went; read again later
            logger.warning("could not read the render domains (Redis: %s)", exc)
            self._read_at = now
            return
        until: dict[str, float] = {}
        for field, value in raw.items():
            try:
                until[field.decode()] = float(value)
            except (UnicodeDecodeError, ValueError):
                logger.warning("render:domains holds a bad entry %r: ignored", field[:80])
        with self._lock:
            self._until, self._read_at = until, now


class RenderRoute:
    """The routing decisions of one HTTP worker (its rules, its jobs', the marked domains)."""

    def __init__(self, settings: Settings, client: redis.Redis, jobs: JobBook) -> None:
        self.jobs = jobs
        self.domains = RenderDomains(client, settings.render_domain_ttl_s)
        self.rules = RuleLookup(lambda rule: rule.render is not None)
        self._missing: dict[str, etree.XPath] = {}

    def before_fetch(self, job: JobRef | None, url: str, asked: object) -> RenderOptions | None:
        """The options to render ``url`` with, or None to fetch it plainly; ``asked``: the
        message's ``render`` field.

        Raises:
            BadRenderOptions: the message's field is not a render value.
        """
        settings = self.jobs.settings_for(job)
        rule = self.rules.match(settings, url)
        if rule is not None and rule.render is False:
            return None
        options = parse_render(asked)
        if options is not None:
            return options
        ruled = rule.render if rule is not None else None
        if isinstance(ruled, RenderOptions) and not ruled.adaptive:
            return ruled
        if settings.render == "always":
            return ruled if isinstance(ruled, RenderOptions) else RenderOptions()
        if (settings.render == "auto" or isinstance(ruled, RenderOptions)) and self.domains.wants(
                job.name if job is not None else DEFAULT_JOB, domain_of(url)):
            return ruled if isinstance(ruled, RenderOptions) else RenderOptions()
        return None

    def after_read(self, job: JobRef | None, url: str, text_length: int | None,
                   body: bytes) -> RenderOptions | None:
        """The options to render a plainly read page with (its domain marked), or None."""
        settings = self.jobs.settings_for(job)
        rule = self.rules.match(settings, url)
        ruled = rule.render if rule is not None else None
        if ruled is False:
            return None
        if isinstance(ruled, RenderOptions) and rule.render_missing is not None:
            if not self._lacks(rule.render_missing, body, url):
                return None
        elif settings.render != "auto" or not looks_like_shell(text_length, body):
            return None
        self.domains.mark(job.name if job is not None else DEFAULT_JOB, domain_of(url))
        return ruled if isinstance(ruled, RenderOptions) else RenderOptions()

    def _lacks(self, xpath: str, body: bytes, url: str) -> bool:
        check = self._missing.get(xpath)
        if check is None:
            check = self._missing[xpath] = etree.XPath(xpath)
        try:
            root = lxml.html.document_fromstring(body, base_url=url)
        except (etree.ParserError, ValueError) as exc:
            logger.info("%s: not parsed for its render check (%s): rendered", url, exc)
            return True
        return not check(root)


__all__ = ["BadRenderOptions", "RenderDomains", "RenderRoute", "looks_like_shell"]
