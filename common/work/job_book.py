"""The worker's book of jobs: each job's definition and page settings, reloaded when they change.

The steps ask it for a job's :class:`~common.jobs.spec.JobSpec` and its page settings (the
fleet's settings with the job's values over them, :meth:`JobSpec.settings_for`). It reloads
every definition from Redis when ``jobs:version`` moved: the admit script returns the version
with a job's state (no round trip of its own on the hot path), and a job the book does not know
yet (submitted since) makes it reload once. Shared by a worker's fetch loops (threads).
"""

from __future__ import annotations

import logging
import threading

import redis

from common.core.config import Settings
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import JobSpec

logger = logging.getLogger(__name__)


class JobBook:
    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.base = settings
        self.registry = JobRegistry(client)
        self.version = -1  # nothing loaded yet
        self._specs: dict[str, JobSpec] = {}
        self._settings: dict[str, Settings] = {}
        self._lock = threading.Lock()

    def note_version(self, version: int) -> None:
        """The version an admit answer carried: reload when it moved."""
        if version != self.version:
            self.reload(version)

    def reload(self, version: int | None = None) -> None:
        """Read every definition again (the version first: a change after it is seen
        next time). ``version``: the one that made the caller reload; another fetch loop
        that has loaded it meanwhile spares this one the read."""
        with self._lock:
            if version is not None and version == self.version:
                return
            version = self.registry.version()
            specs = self.registry.specs()
            self._specs, self._settings, self.version = specs, {}, version
        logger.info("job book: %d job(s) at version %d", len(specs), version)

    def spec(self, ref: JobRef) -> JobSpec | None:
        """The job's definition; None once it was deleted (asked again, the book costs one
        GET of ``jobs:version`` and reloads only when it moved: a deleted job's pages, still
        queued, do not reread every definition each)."""
        spec = self._specs.get(ref.name)
        if spec is None:
            current = self.registry.version()
            if current != self.version:  # submitted since the last load
                self.reload(current)
                spec = self._specs.get(ref.name)
        return spec

    def settings_for(self, ref: JobRef | None) -> Settings:
        """The page settings of a job's pages (the fleet's own for the default job)."""
        if ref is None:
            return self.base
        cached = self._settings.get(ref.name)
        if cached is None:
            spec = self.spec(ref)
            cached = spec.settings_for(self.base) if spec is not None else self.base
            with self._lock:
                self._settings[ref.name] = cached
        return cached
