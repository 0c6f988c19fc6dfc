"""Seeding job runs a slice at a time, every run in turn: a big job's seeds never hold up
another job's start.

The job runner (common/jobs/runner.py) hands every run that is not seeded yet to
:class:`Seeding`; each tick, :meth:`Seeding.round` gives each such run one slice of at most
SEED_SLICE_S of publishing (its seed URLs read from ``job:{name}:seeds`` PRODUCER_BATCH at a
time through the :class:`~common.intake.producer.Producer` with the run), then the next run its
slice, and so on until the round's time is spent; the runner ticks again at once while any run
is still seeding. A run whose seed URLs are all published then has its sitemaps read (each
whole, :func:`~common.intake.sitemaps.produce_site`) and is marked seeded.

The position in a run's seed list lives in this process only: a new leader starts each
half-seeded run from its first seed again, and the run's dedupe publishes only what is missing
(measured: a 500-URL job behind a 50,000-URL job's seeding started 3.1–6.9 s late when one job
was seeded whole before the next was looked at).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from common.core.config import Settings
from common.intake.producer import Producer, ProduceSummary
from common.intake.sitemaps import SitemapReader, produce_site
from common.jobs.registry import JobRef, JobRegistry, JobStateError
from common.jobs.spec import JobSpec
from common.store.keys import job_seeds_key

logger = logging.getLogger(__name__)

#: Publishing time one run gets before the next run's turn.
SEED_SLICE_S = 0.25
#: Publishing time of one round over every seeding run, at most (then the runner's other
#: steps: finishing, limits, schedules).
SEED_ROUND_S = 1.0


class Seeding:
    """The runs being seeded by this runner and where each one is in its seed list."""

    def __init__(self, settings: Settings, client: redis.Redis, registry: JobRegistry,
                 check: Callable[[JobRef], None]) -> None:
        self.settings = settings
        self.client = client
        self.registry = registry
        self.check = check  # the lease renewed, the run still live (raises otherwise)
        self.cursors: dict[JobRef, int] = {}  # run -> next seed index
        self.totals: dict[JobRef, ProduceSummary] = {}

    def want(self, ref: JobRef) -> None:
        """``ref`` has seeds left to publish (a new run, or one a killed leader left)."""
        if ref not in self.cursors:
            self.cursors[ref] = 0
            self.totals[ref] = ProduceSummary()

    def forget(self) -> None:
        """A new leader trusts no position of this one's."""
        self.cursors.clear()
        self.totals.clear()

    @property
    def pending(self) -> bool:
        return bool(self.cursors)

    def round(self, producer: Producer) -> bool:
        """One slice for each seeding run, in turn, for up to SEED_ROUND_S. Returns whether
        any run still has seeds left."""
        deadline = time.monotonic() + SEED_ROUND_S
        while self.cursors and time.monotonic() < deadline:
            for ref in list(self.cursors):
                try:
                    self.slice(ref, producer)
                except JobStateError as exc:  # paused runs go on; cancelled, replaced: not
                    logger.info("job %s: %s", ref.name, exc)
                    self._drop(ref)
                if time.monotonic() >= deadline:
                    break
        return self.pending

    def slice(self, ref: JobRef, producer: Producer) -> None:
        """Publish up to SEED_SLICE_S of ``ref``'s seeds; once all are, its sitemaps, then
        mark it seeded."""
        spec = self.registry.spec(ref.name)
        if spec is None:  # deleted meanwhile
            self._drop(ref)
            return
        submit = JobSubmit(producer, ref, spec, self.check)
        key, size = job_seeds_key(ref.name), self.settings.producer_batch
        deadline = time.monotonic() + SEED_SLICE_S
        while time.monotonic() < deadline:
            start = self.cursors[ref]
            chunk = [u.decode() for u in self.client.lrange(key, start, start + size - 1)]
            if not chunk:
                break
            self.totals[ref].merge(submit.submit(chunk))
            self.cursors[ref] = start + len(chunk)
        else:
            return  # its slice is spent: the next run's turn
        if spec.sitemaps:
            reader = SitemapReader(self.settings, self.client)
            for target in spec.sitemaps:
                self.check(ref)
                # Its errors are logged as they happen (SiteReport.error).
                self.totals[ref].merge(produce_site(target, reader, submit).summary)  # type: ignore[arg-type]
        self.check(ref)
        self.registry.mark_seeded(ref)
        logger.info("job %s run %d seeded: %s", ref.name, ref.run, self.totals[ref].line())
        self._drop(ref)

    def _drop(self, ref: JobRef) -> None:
        self.cursors.pop(ref, None)
        self.totals.pop(ref, None)


class JobSubmit:
    """The producer as produce_site sees it: every submit for one run, the lease renewed and
    the run checked before each batch."""

    def __init__(self, producer: Producer, ref: JobRef, spec: JobSpec,
                 check: Callable[[JobRef], None]) -> None:
        self.producer, self.ref, self.spec, self.check = producer, ref, spec, check

    def submit(self, urls: Iterable[str], **options: Any) -> ProduceSummary:
        self.check(self.ref)
        return self.producer.submit(urls, job=self.ref, job_spec=self.spec, **options)
