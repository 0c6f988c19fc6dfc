"""A job's run as the producer path sees it: its dedupe scope, message fields, page budget,
pace and priority, from the run (:class:`common.jobs.registry.JobRef`) and the job's
definition (:class:`common.jobs.spec.JobSpec`).

Intake sits below the jobs room and may not import it: the two are described here by the
attributes the producer reads (:class:`JobRun`, :class:`JobTerms`), which JobRef and JobSpec
have. A caller without the JobSpec at hand gives the run alone: :class:`JobTermsBook` reads
the terms from the stored definition once per run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from common.core.errors import ServiceUnavailable
from common.core.urls import Fingerprint, job_fingerprint
from common.store.dedupe import RunBudget
from common.store.keys import JOBS
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


@dataclass(frozen=True)
class _Limits:
    pages: int | None = None


@dataclass(frozen=True)
class StoredTerms:
    """A job's terms as stored in ``jobs`` (JobSpec.to_json): what :class:`JobTerms` reads."""

    priority: str = "normal"
    rate_limit: tuple[int, int] | None = None
    limits: _Limits = field(default_factory=_Limits)

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredTerms:
        body = json.loads(text)
        rate = body.get("rate_limit")
        return cls(priority=body.get("priority", "normal"),
                   rate_limit=(int(rate[0]), int(rate[1])) if rate else None,
                   limits=_Limits((body.get("limits") or {}).get("pages")))


class JobTermsBook:
    """The terms of the runs one producer serves, read from ``jobs`` once per run (a job is
    replaced only when it is not running, and its next run has a new number)."""

    KEEP = 1000  #: runs remembered; then the book starts afresh

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._terms: dict[str, JobTerms] = {}

    def intake(self, ref: JobRun, spec: JobTerms | None = None) -> JobIntake:
        """The run's intake, from ``spec`` or the stored definition.

        Raises:
            ValueError: no job of that name is stored (deleted).
            ServiceUnavailable: Redis failed.
        """
        if spec is None:
            spec = self._terms.get(ref.scope)
        if spec is None:
            try:
                raw = self.client.hget(JOBS, ref.name)
            except redis.RedisError as exc:
                raise ServiceUnavailable(f"Redis failed reading job {ref.name!r}: {exc}"
                                         ) from None
            if raw is None:
                raise ValueError(f"no job named {ref.name!r}: its run {ref.run} takes no URLs")
            if len(self._terms) >= self.KEEP:
                self._terms.clear()
            spec = self._terms[ref.scope] = StoredTerms.from_json(raw)
        return JobIntake(ref, spec)
