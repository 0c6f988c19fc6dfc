"""Robots: the URL's origin's robots.txt, asked before its turn is taken (ROBOTS_ENABLED).

The rules come from the worker's memory once known (common/work/robots_gate.py: one worker
fetches an origin's robots.txt, the others park their URL meanwhile). Rules that cannot be had
(RFC 9309's "unavailable") retry the URL with backoff; a robots.txt fetch that failed for a
permanent reason (``failed``: an untrusted certificate, a redirect loop...) dead-letters the
URL at once ``fetch_{kind}`` with the fetch's message, as the page's own fetch would; a path
they disallow is dead-lettered ``robots_disallowed`` (counted ``robots_blocked``). Neither
dead-letters a URL whose outcome is already recorded.

A job whose settings turn ROBOTS_ENABLED off skips robots.txt for its own pages. A job cannot
turn it on where the fleet has it off: the worker then has no robots gate (no rules cache, no
robots fetcher), and the job's ``true`` changes nothing.
"""

from __future__ import annotations

from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Failure, Park, Retry
from common.work.robots_gate import RobotsGate
from common.work.steps.trip import Trip


class Robots:
    def __init__(self, gate: RobotsGate | None, jobs: JobBook | None = None) -> None:
        self.gate = gate  # None: ROBOTS_ENABLED is off, every URL passes (every job's too)
        self.jobs = jobs  # a job's own ROBOTS_ENABLED (off only: see the module docstring)

    def ask_robots(self, trip: Trip) -> Park | Retry | DeadLetter | None:
        """Set ``trip.rules``; park, retry or dead-letter a URL they do not let through."""
        if self.gate is None:
            return None
        if trip.job is not None and self.jobs is not None and \
                not self.jobs.settings_for(trip.job).robots_enabled:
            return None  # the job's own ROBOTS_ENABLED=false
        trip.progress.enter("robots")
        found = self.gate.rules(trip.url)
        if isinstance(found, Park | DeadLetter):
            return found
        if found.failed:
            kind = found.entry.kind
            return DeadLetter(Failure(f"fetch_{kind}", error=f"{kind}: {found.entry.detail}"),
                              unless_done=True)
        if found.unavailable:
            return Retry(Failure("robots_unavailable", error=found.entry.detail))
        if not found.allows(trip.url):
            return DeadLetter(Failure("robots_disallowed"), unless_done=True,
                              count="robots_blocked")
        trip.rules = found
        return None
