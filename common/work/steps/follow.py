"""Follow: the links the page gave, through the producer path, before its record is stored.

Crawl mode's follow rules (CRAWL_ENABLED) and the user code's follow requests (HANDLERS,
EXTRACTOR) go through crawl mode's :class:`~common.intake.crawl.LinkFollower`: scope,
dedupe, CRAWL_MAX_DEPTH, the domain's page budget, robots.txt. Published and claimed for this
page first, so a worker that dies before the record redelivers the page, which publishes
what was not confirmed (common/intake/crawl.py).
"""

from __future__ import annotations

import redis

from common.core.config import Settings
from common.intake.crawl import LinkFollower
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.redirects import scope_of
from common.work.steps.trip import Trip


class Follow:
    def __init__(self, follower: LinkFollower | None, jobs: JobBook | None = None) -> None:
        self.jobs = jobs  # a job's own crawl settings
        self.follower = follower  # None: no crawl mode, handlers or EXTRACTOR: nothing to follow

    @staticmethod
    def follower_for(settings: Settings, client: redis.Redis) -> LinkFollower | None:
        """The worker's link follower: crawl mode and user code's follow requests need one."""
        if settings.crawl_enabled or settings.handlers or settings.extractor:
            return LinkFollower(settings, client)
        return None

    def follow_links(self, trip: Trip) -> Outcome | None:
        """Enqueue the page's links to follow; their counts go into its record."""
        read, message = trip.read, trip.message
        trip.progress.enter("record")
        plan = read.follow if self.follower is not None else None
        if plan is None and not read.call:
            return None
        token = trip.token  # the page's claims on the links it publishes
        if read.call:  # the user code's follow requests (common/work/user_extractor.py), first:
            # in crawl mode the same links are in the plan too, without their handler and meta
            read.call.enqueue(self.follower, message.depth, trip.rules, token)
        if plan is not None:
            followed = self.follower.follow_plan(trip.response.final_url, plan, message.depth,
                                                 trip.rules, page_token=token,
                                                 scope=scope_of(message))
            if followed is not None:
                read.record["followed"] = followed.new
        return None

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
