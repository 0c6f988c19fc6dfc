"""Decode: the delivery's body as a work message, its URL canonical, its own headers checked.

A body that is not a message, a URL that can never be fetched, or request headers that could
split or redirect the request (``extra["headers"]``, a handler's follow request:
:func:`common.core.headers.check_headers`) are dead-lettered here, before anything is counted
or fetched: ``bad_message`` or ``invalid_url``, with the check's text as the error.
"""

from __future__ import annotations

from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import BadMessage, InvalidURL
from common.core.headers import check_headers
from common.core.urls import canonicalize
from common.work.outcome import DeadLetter, Failure
from common.work.steps.trip import Trip


class Decode:
    def __init__(self, max_url_length: int) -> None:
        self.max_url_length = max_url_length

    @classmethod
    def from_settings(cls, settings: Settings) -> Decode:
        return cls(settings.max_url_length)

    def decode_message(self, trip: Trip) -> DeadLetter | None:
        """Set ``trip.message``, ``trip.url`` and ``trip.headers``; a dead letter if bad
        (``trip.url`` is then the URL as received, if any)."""
        try:
            message = WorkMessage.from_json(trip.body)
            trip.url = message.url
            trip.url = canonicalize(message.url, max_length=self.max_url_length)
            asked = message.extra.get("headers")
            if asked is not None:
                try:
                    trip.headers = check_headers(asked)
                except ValueError as exc:
                    raise BadMessage(str(exc)) from None
        except (BadMessage, InvalidURL) as exc:
            return DeadLetter(Failure(exc.reason, error=str(exc)))
        trip.message = message
        return None
