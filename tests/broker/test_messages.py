from __future__ import annotations

import json

import pytest

from common.broker.messages import WorkMessage
from common.core.errors import BadMessage


def test_a_message_round_trips_and_keeps_unknown_fields():
    original = WorkMessage(url="http://a/", enqueued_at=1.5, depth=2, attempts=1, fp="ab",
                           extra={"future": [1, 2]})
    decoded = WorkMessage.from_json(original.to_json())
    assert decoded == original


@pytest.mark.parametrize("body", [
    b"\xff\xfe", b"not json", b"[1,2]", b'{"url": 5}', b'{"nourl": "x"}', b'{"url": ""}',
    b'{"url": "http://a/", "depth": -1}', b'{"url": "http://a/", "attempts": "2"}',
    b'{"url": "http://a/", "enqueued_at": "yesterday"}', b'{"url": "http://a/", "fp": 7}',
])
def test_poison_bodies_raise_bad_message(body):
    with pytest.raises(BadMessage):
        WorkMessage.from_json(body)


def test_wire_format_is_json_with_url_and_enqueued_at():
    data = json.loads(WorkMessage(url="http://a/").to_json())
    assert data["url"] == "http://a/" and isinstance(data["enqueued_at"], float)


@pytest.mark.parametrize("body", [
    b'{"url": "http://a/", "not_before": NaN}',
    b'{"url": "http://a/", "not_before": Infinity}',
    b'{"url": "http://a/", "parked_at": -Infinity}',
    b'{"url": "http://a/", "enqueued_at": 1e400}',
    b'{"url": "http://a/", "future": {"deep": [1, 2, -1e999]}}',
    b'{"url": "http://a/", "slot": ' + b"9" * 400 + b"}",
])
def test_non_finite_or_unrepresentable_numbers_anywhere_are_a_bad_message(body):
    with pytest.raises(BadMessage, match="finite|number"):
        WorkMessage.from_json(body)


def test_large_finite_numbers_are_still_accepted():
    message = WorkMessage.from_json(b'{"url": "http://a/", "not_before": 1e300, "slot": '
                                    + b"9" * 19 + b"}")
    assert message.extra == {"not_before": 1e300, "slot": int("9" * 19)}


def test_a_utf8_body_with_a_byte_order_mark_is_still_read():
    assert WorkMessage.from_json(b'\xef\xbb\xbf{"url": "http://a/"}').url == "http://a/"
