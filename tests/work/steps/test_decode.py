"""Decode: bad bodies, URLs and request headers are dead letters; good ones set the trip."""

from __future__ import annotations

import json

import pytest

from common.work.outcome import DeadLetter
from common.work.steps.decode import Decode
from common.work.steps.trip import Trip
from tests.work.steps.conftest import QUEUE, failure_of, reason


def _trip(message: dict) -> Trip:
    return Trip.begin(json.dumps(message).encode(), QUEUE, False)


def test_a_message_is_decoded_with_its_url_canonical_and_its_headers_checked(settings):
    trip = _trip({"url": "HTTP://127.0.0.1:9/a/../b", "headers": {"X-Token": "abc"}})
    assert Decode.from_settings(settings).decode_message(trip) is None
    assert trip.url == "http://127.0.0.1:9/b"
    assert trip.message.url == "HTTP://127.0.0.1:9/a/../b"
    assert trip.headers == {"X-Token": "abc"}


@pytest.mark.parametrize("headers, error", [
    ({"X-Evil": "a\r\nHost: elsewhere"}, "holds a CR, LF or NUL"),
    ({"Host": "elsewhere.example"}, "set by the fetcher"),
    ({f"X-Big-{n}": "v" * 1024 for n in range(9)}, "over 8192 bytes"),
    (["X-Not: a dict"], "must be a dict"),
])
def test_a_message_whose_headers_fail_the_check_is_dead_lettered_as_bad_message(
        settings, give_up, headers, error):
    trip = _trip({"url": "http://127.0.0.1:9/page", "headers": headers})
    end = Decode.from_settings(settings).decode_message(trip)
    assert isinstance(end, DeadLetter) and failure_of(end) == "bad_message"
    outcome = give_up.settle(trip, end)  # the body as it came, to failed_urls
    assert reason(outcome) == "bad_message" and outcome.url == "http://127.0.0.1:9/page"
    assert error in outcome.publishes[0].headers["last_error"]
    assert outcome.publishes[0].body == trip.body


def test_an_unparsable_body_and_an_unfetchable_url_are_dead_lettered(settings, give_up):
    step = Decode.from_settings(settings)
    garbled = Trip.begin(b"{not json", QUEUE, False)
    outcome = give_up.settle(garbled, step.decode_message(garbled))
    assert reason(outcome) == "bad_message" and outcome.url == "<unparsable>"
    ftp = _trip({"url": "ftp://127.0.0.1/x"})
    outcome = give_up.settle(ftp, step.decode_message(ftp))
    assert reason(outcome) == "invalid_url" and outcome.url == "ftp://127.0.0.1/x"
