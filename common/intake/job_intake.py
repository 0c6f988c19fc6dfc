"""A job's run as the producer path sees it: its dedupe scope, message fields, page budget,
pace and priority, from the run (:class:`common.jobs.registry.JobRef`) and the job's
definition (:class:`common.jobs.spec.JobSpec`).

Intake sits below the jobs room and may not import it: the two are described here by the
attributes the producer reads (:class:`JobRun`, :class:`JobTerms`), which JobRef and JobSpec
have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from common.core.urls import Fingerprint, job_fingerprint
from common.store.dedupe import RunBudget
from common.web.ratelimit import Rate


class JobRun(Protocol):
    """Which run of which job (JobRef)."""

    @property
    def name(self) -> str: ...

    @property
    def run(self) -> int: ...

    @property
    def scope(self) -> str: ...

    def fields(self) -> dict[str, Any]: ...


class JobTerms(Protocol):
    """What the producer obeys of a job's definition (JobSpec)."""

    @property
    def priority(self) -> str: ...

    @property
    def rate_limit(self) -> tuple[int, int] | None: ...

    @property
    def limits(self) -> Any: ...  # .pages: int | None


@dataclass(frozen=True)
class JobIntake:
    """One run's intake: how its URLs are fingerprinted, labelled, budgeted, paced, routed."""

    ref: JobRun
    spec: JobTerms

    @property
    def scope(self) -> str:
        return self.ref.scope

    def fingerprint(self, url: str) -> Fingerprint:
        """The URL's fingerprint within the run (its seen-set member, claim and done mark)."""
        return job_fingerprint(url, self.ref.scope)

    def fields(self) -> dict[str, Any]:
        """The message fields of the run: ``job`` and ``run``."""
        return self.ref.fields()

    @property
    def budget(self) -> RunBudget:
        """Its counters (``known``) and ``limits.pages`` for the claim scripts."""
        return RunBudget(self.ref.name, self.ref.run, self.spec.limits.pages)

    @property
    def pace(self) -> tuple[str, Rate] | None:
        """Its own rate per domain for the deferral (None: the domains' rates alone)."""
        rate = self.spec.rate_limit
        return (self.ref.scope, Rate(*rate)) if rate else None

    @property
    def priority(self) -> bool:
        """Its URLs go to the priority queue."""
        return self.spec.priority == "high"
