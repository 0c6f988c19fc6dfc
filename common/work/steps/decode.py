"""Decode: the delivery's body as a work message, its URL canonical, its own headers checked.

A body that is not a message, a URL that can never be fetched, or request headers that could
split or redirect the request (``extra["headers"]``, a handler's follow request:
:func:`common.core.headers.check_headers`) are dead-lettered here, before anything is counted
or fetched: ``bad_message`` or ``invalid_url``, with the check's text as the error.

A job's message carries ``job`` (a job name, common.jobs.spec.NAME) and ``run`` (an integer,
1 or more), both or neither; neither, or ``job: "default"`` alone, is the default job. Any
other shape is ``bad_message``: a page must not fall into the default job (or another job's
run) by a typo. ``trip.job`` is the message's :class:`~common.jobs.registry.JobRef`.
"""

from __future__ import annotations

from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import BadMessage, InvalidURL
from common.core.headers import check_headers
from common.core.urls import canonicalize
from common.jobs.registry import JobRef
from common.jobs.spec import DEFAULT_JOB, NAME
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
            trip.job = job_of(message.extra)
        except (BadMessage, InvalidURL) as exc:
            return DeadLetter(Failure(exc.reason, error=str(exc)))
        trip.message = message
        return None


def job_of(extra: dict) -> JobRef | None:
    """The job run a message's ``job`` and ``run`` fields name (None: the default job).

    Raises:
        BadMessage: one without the other, a name that is no job name, a run that is not an
            integer of 1 or more, or a run given to the default job.
    """
    name, run = extra.get("job"), extra.get("run")
    if name is None and run is None:
        return None
    if name == DEFAULT_JOB:
        if run is not None:
            raise BadMessage(f"'run' {run!r} given to the default job (it has no runs)")
        return None
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadMessage(f"'job' must be a job name (lower-case letters, digits, '-' and '_', "
                         f"at most 63), not {_shown(name)}")
    if type(run) is not int or run < 1:
        raise BadMessage(f"'run' of job {name!r} must be an integer of 1 or more, "
                         f"not {_shown(run)}")
    return JobRef(name, run)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
