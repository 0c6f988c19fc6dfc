"""Archive: the fetched exchange into the WARC file (ARCHIVE=warc), before any outcome.

The response comes back with its place in the archive, which its record or failure record
carries (common/work/archive.py). A cached response was archived when it was fetched.
"""

from __future__ import annotations

from common.core.config import Settings
from common.work import archive as warc
from common.work.outcome import Outcome
from common.work.steps.trip import Trip


class Archive:
    def __init__(self, archive: warc.Archive | None) -> None:
        self.archive = archive  # None: ARCHIVE is off

    @classmethod
    def from_settings(cls, settings: Settings) -> Archive:
        return cls(warc.Archive.from_settings(settings))  # ARCHIVE=warc

    def archive_response(self, trip: Trip) -> Outcome | None:
        """Replace ``trip.response`` with the archived one; never ends the trip."""
        if self.archive is not None and not trip.cached:
            trip.response = self.archive.write(trip.response)
        return None

    def close(self) -> None:
        if self.archive is not None:
            self.archive.close()
