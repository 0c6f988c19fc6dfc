"""A media request's own field, checked before anything is fetched (common/media/steps.py)."""

from __future__ import annotations

import pytest

from common.broker.messages import BadMessage
from common.media.steps import media_field, offload


@pytest.mark.parametrize("extra, says", [
    ({}, "not a media request"),
    ({"media": "image"}, "not a media request"),
    ({"media": {"kind": "photo"}}, "media.kind"),
    ({"media": {"kind": "image", "types": "image/*"}}, "media.types"),
    ({"media": {"kind": "image", "types": []}}, "media.types"),
    ({"media": {"kind": "image", "types": ["png"]}}, "a media type is like"),
    ({"media": {"kind": "image", "page": 5}}, "media.page"),
    ({"media": {"kind": "video", "tool": ["yt-dlp"]}}, "media.tool"),
])
def test_a_malformed_media_field_is_a_bad_message_saying_why(extra, says):
    with pytest.raises(BadMessage) as caught:
        media_field(extra)
    assert says in str(caught.value)


def test_a_good_media_field_passes_as_it_is():
    field = {"kind": "document", "types": ["application/pdf"], "page": "http://a.test/"}
    assert media_field({"media": field}) is field


def test_offload_returns_the_calls_value_and_raises_its_error():
    assert offload(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        offload(lambda: 1 / 0)
