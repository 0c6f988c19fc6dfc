"""Read: the response into its record, parsed once (common/work/page_record.py).

Extraction rules (EXTRACT_RULES), the user's handlers or EXTRACTOR, and crawl mode's follow
rules all read the one parse; the stages it enters (parse, extract) are the ones the stuck-page
watch may end (common/work/poison.py). Nothing is stored or enqueued here.

A job's page is read with its job's own settings: a reader per job, made again when the job
book's version moved, its user code the worker's router the job names (one per router for
every job, :class:`~common.work.page_record.UserCodes`). A job naming a router this worker
lacks, or rules this worker refuses, dead-letters the page (``handler_missing``,
``job_settings_invalid``), never the worker.
"""

from __future__ import annotations

import logging
import threading

from common.core.config import Settings
from common.core.errors import ConfigError
from common.jobs.registry import JobRef
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Failure, Outcome
from common.work.page_record import HandlerMissing, PageReader, UserCodes
from common.work.steps.trip import Trip

logger = logging.getLogger(__name__)


class Read:
    def __init__(self, pages: PageReader, jobs: JobBook | None = None) -> None:
        self.pages = pages
        self.jobs = jobs  # a job's own rules, user code and crawl mode
        self.codes = UserCodes(pages.settings, pages.custom)  # ConfigError: a bad router
        #: job name -> its reader or why there is none, at the job book's version ``_version``
        self._readers: dict[str, PageReader | Failure] = {}
        self._version = -1
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, jobs: JobBook | None = None) -> Read:
        return cls(PageReader(settings), jobs)  # EXTRACT_RULES, HANDLERS, EXTRACTOR: ConfigError

    def read_page(self, trip: Trip) -> Outcome | DeadLetter | None:
        """Set ``trip.read``: the page's record, its links to follow, the user code's call."""
        message = trip.message
        pages = self.reader_for(trip.job)
        if isinstance(pages, Failure):
            return DeadLetter(pages, trip.retime)
        trip.read = pages.read(trip.url, trip.response, queue=trip.queue,
                               depth=message.depth, attempts=message.attempts + 1,
                               cached=trip.cached, progress=trip.progress, message=message)
        return None

    def reader_for(self, job: JobRef | None) -> PageReader | Failure:
        """The reader of ``job``'s pages (the worker's own for the default job), or the
        failure of its pages when its settings cannot be read here."""
        if job is None or self.jobs is None:
            return self.pages
        if self._version == self.jobs.version:
            known = self._readers.get(job.name)
            if known is not None:
                return known
        version = self.jobs.version  # before the settings: a reload after it is seen next time
        settings = self.jobs.settings_for(job)
        reader: PageReader | Failure
        try:
            reader = PageReader(settings, self.codes)
        except HandlerMissing as exc:
            reader = Failure("handler_missing", error=f"job {job.name}: {exc}")
        except ConfigError as exc:
            reader = Failure("job_settings_invalid", error=f"job {job.name}: {exc}")
        if isinstance(reader, Failure):
            logger.warning("%s", reader.error)
        with self._lock:  # a replaced reader owns no child: its user code is self.codes'
            if self._version != version:  # every job's reader is made again, deleted jobs' go
                self._readers, self._version = {}, version
            self._readers[job.name] = reader
        return reader

    def warm(self) -> None:
        """Start the calling fetch loop's user-code children (common/work/user_extractor.py)."""
        if self.pages.custom is not None:
            self.pages.custom.warm()

    def close(self) -> None:
        self.codes.close()  # every router's child processes, the default job's too
