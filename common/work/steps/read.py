"""Read: the response into its record, parsed once (common/work/page_record.py).

Extraction rules (EXTRACT_RULES), the user's handlers or EXTRACTOR, and crawl mode's follow
rules all read the one parse; the stages it enters (parse, extract) are the ones the stuck-page
watch may end (common/work/poison.py). Nothing is stored or enqueued here.
"""

from __future__ import annotations

from common.core.config import Settings
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.page_record import PageReader
from common.work.steps.trip import Trip


class Read:
    def __init__(self, pages: PageReader, jobs: JobBook | None = None) -> None:
        self.pages = pages
        self.jobs = jobs  # a job's own rules, user code and crawl mode

    @classmethod
    def from_settings(cls, settings: Settings, jobs: JobBook | None = None) -> Read:
        return cls(PageReader(settings), jobs)  # EXTRACT_RULES, HANDLERS, EXTRACTOR: ConfigError

    def read_page(self, trip: Trip) -> Outcome | None:
        """Set ``trip.read``: the page's record, its links to follow, the user code's call."""
        message = trip.message
        trip.read = self.pages.read(trip.url, trip.response, queue=trip.queue,
                                    depth=message.depth, attempts=message.attempts + 1,
                                    cached=trip.cached, progress=trip.progress, message=message)
        return None

    def warm(self) -> None:
        """Start the calling fetch loop's user-code children (common/work/user_extractor.py)."""
        if self.pages.custom is not None:
            self.pages.custom.warm()

    def close(self) -> None:
        if self.pages.custom is not None:  # the user code's child processes
            self.pages.custom.close()
