"""Crawl mode: workers feed the links they extract back through the producer path.

Like scrapy-redis's RedisCrawlSpider, but every link goes through the fleet's one
canonicalise → dedupe → route → confirmed publish path (:class:`common.intake.producer.Producer`),
so a page reached by many links is fetched once. Rules:

* which of a page's links are candidates is the worker's follow rules' choice
  (common/work/follow.py: link areas, allow/deny, ``nofollow``);
* only links whose host is the page's own host (default) or in CRAWL_ALLOWED_DOMAINS (or a
  follow rule's ``domains``; a domain also covers its subdomains);
* depth: a seed has depth 0; links of a page at depth d get d + 1 and are followed only while
  d + 1 <= CRAWL_MAX_DEPTH (or the follow rule's ``depth``);
* a budget of CRAWL_MAX_PAGES_PER_DOMAIN enqueued pages per domain, counted atomically in
  Redis (``crawl:pages:{domain}``) after dedupe, so only new URLs spend it; a job's run has
  budgets of its own (``crawl:pages:{name}/{run}|{domain}``);
* links the page's own robots.txt disallows are not enqueued at all.

Links are published *before* the page's result is recorded, and a link is marked seen only
once its publish is confirmed: if the worker dies in between, the redelivered page extracts
them again and publishes what was not marked. While a page publishes its new links they are
claimed for it (``claim:{fp}``), so two pages linking the same new URL at the same moment
publish it once; the redelivered page takes its own claims over. Seeds are claimed the same
way by their producer, so a page linking a seed (itself) whose confirm is still on its way
skips it: each page fetched once, seeds too. Each fetch thread owns its own Producer (AMQP
connection), created on first use.

A job's page follows under its job's crawl settings (:meth:`LinkFollower.for_job`: depth,
allowed domains, budget; the producers shared) and its links are published in its run.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from common.core.config import Settings
from common.core.urls import domain_of, setting_host
from common.intake.job_intake import JobRun
from common.intake.producer import Producer, ProduceSummary
from common.store.keys import crawl_pages_key
from common.web.robots import RobotsRules


class FollowPlanLike(Protocol):
    """What :meth:`LinkFollower.follow_plan` reads of a page's plan (common/work/follow.py,
    a floor above: intake may not import it)."""

    links: tuple[str, ...]
    max_depth: int
    priority: bool
    domains: tuple[str, ...] | None


# KEYS[1] crawl:pages:{domain}   ARGV[1] wanted   ARGV[2] budget
# Spends up to ``wanted`` pages of the domain's budget; returns how many were granted.
SPEND_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = tonumber(ARGV[2]) - used
if left <= 0 then return 0 end
local grant = math.min(left, tonumber(ARGV[1]))
redis.call('INCRBY', KEYS[1], grant)
return grant
"""


class ThreadProducers:
    """One :class:`Producer` (AMQP connection) per thread that publishes (a worker's fetch
    loop: its tasks publish one at a time, never across a switch), created on its first use."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self._local = threading.local()
        self._producers: list[Producer] = []
        self._lock = threading.Lock()

    def get(self) -> Producer:
        producer = getattr(self._local, "producer", None)
        if producer is None:
            producer = Producer(self.settings, self.client)
            self._local.producer = producer
            with self._lock:
                self._producers.append(producer)
        return producer

    def close(self) -> None:
        """Close every fetch thread's producer (called once, when the worker stops)."""
        with self._lock:
            producers, self._producers = self._producers, []
        for producer in producers:
            producer.close()


class LinkFollower:
    def __init__(self, settings: Settings, client: redis.Redis, *, job: JobRun | None = None,
                 producers: ThreadProducers | None = None) -> None:
        self.settings = settings
        self.client = client
        self.job = job  # the run the links are published in (None: the default job)
        self.allowed = tuple(setting_host(d) for d in settings.crawl_allowed_domains.split(",")
                             if d.strip())
        self._spend = client.register_script(SPEND_LUA)
        self._own_producers = producers is None
        self.producers = producers or ThreadProducers(settings, client)

    def for_job(self, settings: Settings, job: JobRun) -> LinkFollower:
        """The follower of a job's pages: its crawl settings (``settings``, the job's page
        settings), its run's budgets, this follower's producers."""
        return LinkFollower(settings, self.client, job=job, producers=self.producers)

    def close(self) -> None:
        """Close every fetch thread's producer (called once, when the worker stops)."""
        if self._own_producers:
            self.producers.close()

    def in_scope(self, page_url: str, link: str,
                 domains: tuple[str, ...] | None = None) -> bool:
        """Whether ``link`` is in scope: its host is in ``domains`` (a follow rule's; else
        CRAWL_ALLOWED_DOMAINS), a domain covering its subdomains, or with neither the page's."""
        host = domain_of(link)
        allowed = self.allowed if domains is None else domains
        if not allowed:
            return host == domain_of(page_url)
        return any(host == d or host.endswith("." + d) for d in allowed)

    def follow_plan(self, page_url: str, plan: FollowPlanLike, depth: int,
                    rules: RobotsRules | None, page_token: str,
                    scope: str | None = None) -> ProduceSummary | None:
        """Enqueue what a page's follow rules kept (:class:`common.work.follow.FollowPlan`)."""
        if not plan.links:
            return None
        return self.follow(page_url, plan.links, depth, rules, page_token,
                           force_priority=plan.priority, max_depth=plan.max_depth,
                           domains=plan.domains, scope=scope)

    def follow(self, page_url: str, links: Sequence[str], depth: int,
               rules: RobotsRules | None, page_token: str,
               force_priority: bool = False, max_depth: int | None = None,
               domains: tuple[str, ...] | None = None,
               scope: str | None = None,
               extra: dict[str, Any] | None = None) -> ProduceSummary | None:
        """Enqueue the in-scope links of a page at ``depth``; None when nothing to follow.

        ``page_token`` names the page (the same on a redelivery): its new links are claimed
        for it while they are published (see :class:`common.store.dedupe.Claims`).
        ``force_priority`` routes them to the priority queue (EXTRACTOR's ``priority``, a
        follow rule's); ``max_depth`` and ``domains`` are a follow rule's (default
        CRAWL_MAX_DEPTH and CRAWL_ALLOWED_DOMAINS). ``scope`` is the URL the producer
        accepted when the page was reached through a redirect to another host: the "own
        host" rule is judged from it, not from where the redirect landed. ``extra``: fields
        for every message (a handler's follow request: ``handler``, ``meta``, ``headers``).
        """
        limit = self.settings.crawl_max_depth if max_depth is None else max_depth
        if depth + 1 > limit:
            return None
        chosen = [link for link in links if self.in_scope(scope or page_url, link, domains)
                  and (rules is None or domain_of(link) != domain_of(page_url)
                       or rules.allows(link))]
        if not chosen:
            return None
        return self.producers.get().submit(chosen, depth=depth + 1, keep=self.within_budget,
                                           claim_token=page_token,
                                           force_priority=force_priority, extra=extra,
                                           job=self.job)

    def within_budget(self, urls: list[str]) -> list[bool]:
        by_domain: dict[str, list[int]] = defaultdict(list)
        for index, url in enumerate(urls):
            by_domain[domain_of(url)].append(index)
        verdicts = [False] * len(urls)
        prefix = f"{self.job.scope}|" if self.job is not None else ""  # a run's own budget
        for domain, indexes in by_domain.items():
            granted = int(self._spend(keys=[crawl_pages_key(prefix + domain)],
                                      args=[len(indexes), self.settings.crawl_max_pages]))
            for index in indexes[:granted]:
                verdicts[index] = True
        return verdicts
