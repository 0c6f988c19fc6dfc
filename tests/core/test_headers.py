"""Request headers a handler asks for are checked once, the same way everywhere."""

from __future__ import annotations

import pytest

from common.core.headers import MAX_HEADERS_BYTES, check_headers


def test_ordinary_headers_pass_unchanged():
    assert check_headers({"Accept-Language": "de", "X-Token": "abc def"}) == {
        "Accept-Language": "de", "X-Token": "abc def"}


@pytest.mark.parametrize(("value", "error"), [
    (["Accept", "x"], "must be a dict"),
    ({"Bad Name": "x"}, "is not a token"),
    ({"": "x"}, "is not a token"),
    ({"Transfer-Encoding": "chunked"}, "set by the fetcher"),
    ({"host": "evil.test"}, "set by the fetcher"),
    ({"X-A": 1}, "must be a string"),
    ({"X-A": "a\nb"}, "CR, LF or NUL"),
    ({"X-A": "a\0b"}, "CR, LF or NUL"),
    ({"X-A": "v" * MAX_HEADERS_BYTES}, f"over {MAX_HEADERS_BYTES} bytes"),
])
def test_a_header_that_could_split_reframe_or_retarget_a_request_is_refused(value, error):
    with pytest.raises(ValueError, match=error):
        check_headers(value)


@pytest.mark.parametrize("name", ["Accept-Encoding", "user-agent"])
def test_the_encodings_and_the_fleet_s_identity_are_not_a_request_s_to_change(name):
    with pytest.raises(ValueError, match="set by the fetcher"):
        check_headers({name: "x"})
