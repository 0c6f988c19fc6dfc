"""Decode: bad bodies, URLs and request headers are dead letters; good ones set the trip."""

from __future__ import annotations

import json

import pytest

from common.work.steps.decode import Decode
from common.work.steps.trip import Trip
from tests.work.steps.conftest import QUEUE, reason


def _trip(message: dict) -> Trip:
    return Trip.begin(json.dumps(message).encode(), QUEUE, False)


def test_a_message_is_decoded_with_its_url_canonical_and_its_headers_checked(settings,
                                                                              give_up):
    step = Decode.from_settings(settings, give_up)
    trip = _trip({"url": "HTTP://127.0.0.1:9/a/../b", "headers": {"X-Token": "abc"}})
    assert step.decode_message(trip) is None
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
    outcome = Decode.from_settings(settings, give_up).decode_message(
        _trip({"url": "http://127.0.0.1:9/page", "headers": headers}))
    assert reason(outcome) == "bad_message"
    assert error in outcome.publishes[0].headers["last_error"]
    assert outcome.url == "http://127.0.0.1:9/page"


def test_an_unparsable_body_and_an_unfetchable_url_are_dead_lettered(settings, give_up):
    step = Decode.from_settings(settings, give_up)
    garbled = step.decode_message(Trip.begin(b"{not json", QUEUE, False))
    assert reason(garbled) == "bad_message" and garbled.url == "<unparsable>"
    assert reason(step.decode_message(_trip({"url": "ftp://127.0.0.1/x"}))) == "invalid_url"
