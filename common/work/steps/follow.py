"""Follow: the links the page gave, through the producer path, before its record is stored;
and the assets it references (a rule's ``media``, a handler's ``page.download``) to the media
queues, claimed for the page the same way (common/work/media_refs.py).

Crawl mode's follow rules (CRAWL_ENABLED) and the user code's follow requests (HANDLERS,
EXTRACTOR) go through crawl mode's :class:`~common.intake.crawl.LinkFollower`: scope,
dedupe, CRAWL_MAX_DEPTH, the domain's page budget, robots.txt. Published and claimed for this
page first, so a worker that dies before the record redelivers the page, which publishes
what was not confirmed (common/intake/crawl.py).

A job's page follows under its job's crawl settings (depth, allowed domains, its run's page
budget, nofollow: read with the page) and its links are published in its run: a follower per
job (:meth:`~common.intake.crawl.LinkFollower.for_job`), made again when the job book's version
moved, all sharing the fetch threads' producers.
"""

from __future__ import annotations

import threading

import redis

from common.core.config import Settings
from common.intake.crawl import LinkFollower, ThreadProducers
from common.jobs.registry import JobRef
from common.work.job_book import JobBook
from common.work.media_refs import request_media
from common.work.outcome import Outcome
from common.work.redirects import scope_of
from common.work.steps.trip import Trip


class Follow:
    def __init__(self, follower: LinkFollower | None, jobs: JobBook | None = None) -> None:
        self.jobs = jobs  # a job's own crawl settings
        self.follower = follower  # None: no crawl mode, handlers or EXTRACTOR: nothing to follow
        #: job name -> its follower, at the job book's version ``_version``
        self._followers: dict[str, LinkFollower] = {}
        self._version = -1
        self._producers: ThreadProducers | None = None  # jobs' when the worker has no follower
        self._lock = threading.Lock()

    @staticmethod
    def follower_for(settings: Settings, client: redis.Redis) -> LinkFollower | None:
        """The worker's link follower: crawl mode and user code's follow requests need one."""
        if (settings.crawl_enabled or settings.handlers or settings.extractor
                or settings.extract_rules.strip()):  # a rule's media (common/work/media_refs.py)
            return LinkFollower(settings, client)
        return None

    def follow_links(self, trip: Trip) -> Outcome | None:
        """Enqueue the page's links to follow; their counts go into its record."""
        read, message = trip.read, trip.message
        trip.progress.enter("record")
        follower = self.follower
        if trip.job is not None and self.jobs is not None and (
                read.follow is not None or read.call or read.media):
            follower = self.job_follower(trip.job)
        plan = read.follow if follower is not None else None
        if plan is None and not read.call and not read.media:
            return None
        token = trip.token  # the page's claims on the links it publishes
        self.request_media(trip, follower, token)
        if read.call:  # the user code's follow requests (common/work/user_extractor.py), first:
            # in crawl mode the same links are in the plan too, without their handler and meta
            read.call.enqueue(follower, message.depth, trip.rules, token)
        if plan is not None:
            followed = follower.follow_plan(trip.response.final_url, plan, message.depth,
                                            trip.rules, page_token=token,
                                            scope=scope_of(message))
            if followed is not None:
                read.record["followed"] = followed.new
        return None

    @staticmethod
    def request_media(trip: Trip, follower: LinkFollower | None, token: str) -> None:
        """Publish the assets the page references (its rule's ``media``, its handler's
        ``page.download``) to the media queues; their URLs go into its record (``assets``),
        how many were new too (``assets_new``): the asset records name the page back."""
        read = trip.read
        groups = list(read.media or ())
        if read.call is not None and any(g.get("media") for g in read.call.follow):
            groups += [g for g in read.call.follow if g.get("media")]
            read.call.follow = [g for g in read.call.follow if not g.get("media")]
        if not groups or follower is None:
            return
        read.record["assets"] = [url for group in groups for url in group["urls"]]
        read.record["assets_new"] = request_media(follower, trip.url, groups,
                                                  trip.message.depth, token)

    def job_follower(self, job: JobRef) -> LinkFollower:
        """The follower of ``job``'s pages: its crawl settings, its run."""
        known = self._followers.get(job.name) if self._version == self.jobs.version else None
        if known is not None and known.job == job:
            return known
        version = self.jobs.version  # before the settings: a reload after it is seen next time
        settings = self.jobs.settings_for(job)
        with self._lock:
            if self.follower is not None:
                follower = self.follower.for_job(settings, job)
            else:  # the fleet follows nothing; this job does (crawl mode, its handlers)
                client = self.jobs.registry.client
                if self._producers is None:
                    self._producers = ThreadProducers(self.jobs.base, client)
                follower = LinkFollower(settings, client, job=job, producers=self._producers)
            if self._version != version:  # every job's follower is made again
                self._followers, self._version = {}, version
            self._followers[job.name] = follower
        return follower

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
        if self._producers is not None:
            self._producers.close()
