"""The job runner: one leader (lease ``jobs:lease``) that starts, seeds, stops, finishes and
schedules job runs, and sends their webhooks. It runs inside ``scrape-fleet schedule run`` /
``scheduler.py run``, beside the recrawl scheduler; run two or more, one leads.

Lease: :class:`JobsLease`, the recrawl scheduler's (common/intake/recrawler.py: ``token:owner``,
``SET NX PX`` SCHEDULE_LEASE_S, fencing tokens from ``schedule:fence``) on ``jobs:lease``. The
leader renews it every tick (JOB_TICK_S, at most SCHEDULE_LEASE_S / 4) and between seed
batches; a killed leader's lease expires and the next replica takes over within the lease plus
a tick. Every step below is one registry change that checks the state it expects, so a deposed
leader acting once more in the same moment changes nothing twice.

Each tick, for every job (:meth:`JobRunner.tick`):

* ``created`` → ``start_run`` (run n + 1) → seeded a slice at a time, every seeding run in
  turn (common/jobs/seeding.py): the job's seed URLs then its sitemaps through the
  :class:`Producer` with ``job=ref`` → ``mark_seeded``. A run ``running`` (or ``paused``)
  with ``seeded`` < run was left half-seeded by a killed leader: it is seeded again; the run's
  dedupe publishes only what is missing. Seeding stops when the run is no longer the job's
  current, live run. While any run is seeding the runner ticks again at once.
* ``running``, seeded: over ``limits.duration`` (from its start) or ``limits.bytes`` → stopped
  with reason ``limit: duration`` / ``limit: bytes`` (``cancel``). Else finished (``finish``)
  once every URL it knows has its outcome (``outcomes() >= known``), no worker heartbeat
  shows a page of it in flight, and all of that unchanged for JOB_QUIET_S. ``paused`` runs
  neither finish nor stop (the limits apply again once resumed).
* Ended with a ``schedule`` (finished, or stopped by a limit; a user's cancel ends the
  schedule): the next run is planned (``plan_next``: ``every`` from the run's start, or the
  cron's next time after its end) and started when due.

Webhooks (common/jobs/webhooks.py) are queued before the run is finished or stopped, in the
same tick, and sent by a sender thread while this replica leads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import REDIS_UNAVAILABLE, ServiceUnavailable
from common.intake.hosts import HostCheck
from common.intake.producer import Producer
from common.intake.recrawler import Lease
from common.jobs.cron import next_after
from common.jobs.registry import ENDED, JobRef, JobRegistry, JobState, JobStateError, outcomes
from common.jobs.seeding import Seeding
from common.jobs.spec import JobSpec
from common.jobs.webhooks import Webhooks
from common.store.keys import (
    JOBS_LEASE,
    JOBS_VERSION,
    job_key,
)
from common.store.workers import alive_workers

logger = logging.getLogger(__name__)

#: The reason prefix of a run stopped by its limits (its schedule goes on; a user's cancel
#: ends it).
LIMIT = "limit: "

# KEYS[1] job:{name}  KEYS[2] jobs:version  ARGV[1] run
# A scheduled job whose run ARGV[1] was stopped by a limit (cancelled, reason "limit: …") is
# made finished, so start_run can start its next run. Returns 1 when it did.
REOPEN_LUA = """
local state, run, reason = unpack(redis.call('HMGET', KEYS[1], 'state', 'run', 'reason'))
if state == 'cancelled' and run == ARGV[1] and string.sub(reason or '', 1, 7) == 'limit: ' then
  redis.call('HSET', KEYS[1], 'state', 'finished')
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
"""


class JobsLease(Lease):
    """The job runner's lease: the recrawl scheduler's on ``jobs:lease``."""

    def __init__(self, client: redis.Redis, ttl_ms: int, owner: str | None = None) -> None:
        super().__init__(client, ttl_ms, owner, key=JOBS_LEASE)


class Deposed(Exception):
    """The lease was lost mid-step: another runner leads now."""


class JobRunner:
    """The job loop of one replica (see the module docstring)."""

    def __init__(self, settings: Settings, client: redis.Redis, lease: Lease, *,
                 webhooks: Webhooks | None = None,
                 producer: Callable[[], Producer] | None = None) -> None:
        self.settings = settings
        self.client = client
        self.lease = lease
        self.registry = JobRegistry(client)
        self.webhooks = webhooks or Webhooks(client, settings)
        self.tick_s = min(settings.job_tick_s, settings.schedule_lease_s / 4)
        self.quiet_s = settings.job_quiet_s
        self.token = 0
        self._producer = producer or self._new_producer
        self._reopen = client.register_script(REOPEN_LUA)
        self._quiet: dict[JobRef, tuple[Any, float]] = {}  # run -> (what it showed, since)
        self._unreadable: set[str] = set()  # jobs whose definition failed to load (said once)
        self.seeding = Seeding(settings, client, self.registry, self._still_seeding)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        """Lead or wait until ``stop``; then give the lease up. Returns the exit code (0)."""
        sender = threading.Thread(target=self._send_webhooks, args=(stop,), name="webhooks",
                                  daemon=True)
        sender.start()
        attempt = 0
        try:
            while not stop.is_set():
                try:
                    self._lead(self.lease.hold())
                    seeding = self.tick() if self.token else False
                    attempt = 0
                except Deposed as exc:
                    logger.warning("job runner %s: %s", self.lease.owner, exc)
                    self._lead(0)
                except (*REDIS_UNAVAILABLE, redis.exceptions.OutOfMemoryError,
                        ServiceUnavailable) as exc:
                    attempt += 1
                    delay = reconnect_delay_s(attempt)
                    logger.warning("job runner: %s; retry in %.1f s", exc, delay)
                    stop.wait(delay)
                    continue
                stop.wait(0 if seeding else self.tick_s)  # a run seeding: its next slice now
        finally:
            self.token = 0
            try:
                self.lease.release()
            except REDIS_UNAVAILABLE as exc:
                logger.warning("job runner: lease not released (it expires by itself): %s", exc)
            sender.join(timeout=self.settings.job_webhook_timeout_s * 2 + 5)
            self.webhooks.close()
        return 0

    def tick(self) -> bool:
        """One look at every job (see the module docstring), then a round of seeding.
        Returns whether a run still has seeds to publish."""
        inflight = self._inflight()
        now_ms = _now_ms()
        for state in self.registry.states():
            try:
                spec = self.registry.spec(state.name)
            except (ValueError, TypeError, KeyError) as exc:  # one bad definition: not all jobs
                if state.name not in self._unreadable:
                    logger.error("job %s: its stored definition does not load (%s): skipped "
                                 "until it is submitted again", state.name, exc)
                self._unreadable.add(state.name)
                continue
            self._unreadable.discard(state.name)
            if spec is None:
                continue
            try:
                self._step(state, spec, inflight, now_ms)
            except JobStateError as exc:  # a user's command got there first: next tick sees it
                logger.info("job %s: %s", state.name, exc)
        if not self.seeding.pending:
            return False
        with self._producer() as producer:
            return self.seeding.round(producer)

    def _step(self, state: JobState, spec: JobSpec, inflight: dict[str, int],
              now_ms: int) -> None:
        ref = state.ref
        if state.state == "created":
            self.seeding.want(self.registry.start_run(state.name))
        elif state.state in ("running", "paused") and ref and state.seeded < ref.run:
            if ref not in self.seeding.cursors:
                logger.info("job %s run %d: seeding (again, if a leader before this one "
                            "started it)", ref.name, ref.run)
            self.seeding.want(ref)
        elif state.state == "running" and ref:
            counters = self.registry.counters(ref)
            if (over := self._over_limit(spec, state, counters, now_ms)) is not None:
                self._end(ref, spec, "cancelled", LIMIT + over)
            elif self._quiet_for(ref, counters, inflight.get(ref.scope, 0)):
                self._end(ref, spec, "finished", "nothing left")
        elif state.state in ENDED and spec.schedule is not None and ref and (
                state.state == "finished" or state.reason.startswith(LIMIT)):
            self._schedule(state, spec, now_ms)

    def _end(self, ref: JobRef, spec: JobSpec, state: str, reason: str) -> None:
        """Queue the run's webhooks, then finish or stop it (a runner killed in between
        leaves them queued; the next leader queues them again as a no-op)."""
        self.webhooks.queue(ref, spec.webhooks, state, reason)
        if state == "finished":
            self.registry.finish(ref, reason)
        else:
            self.registry.cancel(ref.name, reason)
        self._quiet.pop(ref, None)
        logger.info("job %s run %d %s (%s): %s", ref.name, ref.run, state, reason,
                    self.registry.counters(ref))

    def _schedule(self, state: JobState, spec: JobSpec, now_ms: int) -> None:
        schedule = spec.schedule
        assert schedule is not None
        if not state.next_run:
            if schedule.every_s is not None:
                at_ms = (state.started or state.ended) + schedule.every_s * 1000
            else:
                assert schedule.cron is not None
                at_ms = int(next_after(schedule.cron, state.ended / 1000) * 1000)
            self.registry.plan_next(state.name, at_ms)
            logger.info("job %s: run %d planned in %.1f s", state.name, state.run + 1,
                        max(0, at_ms - now_ms) / 1000)
        elif state.next_run <= now_ms:
            if state.state == "cancelled":
                self._reopen(keys=[job_key(state.name), JOBS_VERSION], args=[state.run])
            self.seeding.want(self.registry.start_run(state.name))

    # -- seeding (common/jobs/seeding.py) ------------------------------------------------
    def _still_seeding(self, ref: JobRef) -> None:
        """Renew the lease (Deposed when lost); a run no longer live stops seeding."""
        token = self.lease.hold()
        if token != self.token:
            raise Deposed(f"lease lost while seeding job {ref.name} run {ref.run} "
                          "(the next leader seeds it again)")
        state = self.registry.state(ref.name)
        if state.run != ref.run or state.state not in ("running", "paused"):
            raise JobStateError(f"run {ref.run} is {state.state} (now run {state.run}): "
                                "seeding stopped")

    def _new_producer(self) -> Producer:
        hosts = HostCheck.for_fleet(self.settings, alive_workers(self.client))
        return Producer(self.settings, self.client, hosts=hosts)

    # -- the end of a run --------------------------------------------------------------------
    def _over_limit(self, spec: JobSpec, state: JobState, counters: dict[str, int],
                    now_ms: int) -> str | None:
        limits = spec.limits
        if limits.duration_s is not None and now_ms >= state.started + limits.duration_s * 1000:
            return "duration"
        if limits.bytes is not None and counters.get("bytes", 0) >= limits.bytes:
            return "bytes"
        return None

    def _quiet_for(self, ref: JobRef, counters: dict[str, int], inflight: int) -> bool:
        """Nothing left of the run, and so for JOB_QUIET_S (the same counters all along)."""
        if outcomes(counters) < counters.get("known", 0) or inflight:
            self._quiet.pop(ref, None)
            return False
        shown, now = tuple(sorted(counters.items())), time.monotonic()
        seen = self._quiet.get(ref)
        if seen is None or seen[0] != shown:
            self._quiet[ref] = (shown, now)
            return False
        return now - seen[1] >= self.quiet_s

    def _inflight(self) -> dict[str, int]:
        """Pages in flight per run (``name/run``), from the workers' heartbeats."""
        pages: dict[str, int] = {}
        for beat in alive_workers(self.client):
            jobs = beat.get("jobs")
            if isinstance(jobs, dict):
                for scope, count in jobs.items():
                    pages[scope] = pages.get(scope, 0) + int(count)
        return pages

    # -- leadership and webhooks -------------------------------------------------------------
    def _lead(self, token: int) -> None:
        if token and token != self.token:
            logger.info("job runner %s leads (fencing token %d)", self.lease.owner, token)
            self._quiet.clear()  # what another leader saw is not ours to trust
            self.seeding.forget()
        elif self.token and not token:
            logger.warning("job runner %s lost the lease (token %d)", self.lease.owner,
                           self.token)
        self.token = token

    def _send_webhooks(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.token:
                try:
                    self.webhooks.send_due()
                except (*REDIS_UNAVAILABLE, redis.exceptions.OutOfMemoryError) as exc:
                    logger.warning("webhooks: Redis failed (%s); again next tick", exc)
            stop.wait(self.tick_s)


def _now_ms() -> int:
    return int(time.time() * 1000)
