"""Media type patterns, caps per type and what a request's types narrow MEDIA_TYPES to."""

from __future__ import annotations

import pytest

from common.core.media_types import (
    cap_for,
    check_pattern,
    media_request,
    media_type_of,
    narrow,
    parse_caps,
    wanted,
)

DEFAULT = ("image/*", "application/pdf", "video/*", "audio/*")


@pytest.mark.parametrize("asked, allowed, both", [
    (("image/*",), DEFAULT, ("image/*",)),
    (("*",), DEFAULT, DEFAULT),
    (("image/png",), DEFAULT, ("image/png",)),
    (("application/*",), DEFAULT, ("application/pdf",)),
    (("application/zip",), DEFAULT, ()),
    (("image/*",), ("*",), ("image/*",)),
    (("image/*",), ("image/png",), ("image/png",)),
    (("image/*", "text/*"), DEFAULT, ("image/*",)),
])
def test_a_requests_types_are_narrowed_to_what_the_fleet_allows(asked, allowed, both):
    assert narrow(asked, allowed) == both


def test_the_most_specific_cap_applies_and_star_is_required():
    caps = parse_caps("image/*=25MB, image/gif=1MB, application/pdf=200MB, *=500MB")
    assert cap_for(caps, "image/gif") == 1_000_000
    assert cap_for(caps, "image/png") == 25_000_000
    assert cap_for(caps, "application/zip") == 500_000_000
    with pytest.raises(ValueError, match=r"'\*=size'"):
        parse_caps("image/*=25MB")
    with pytest.raises(ValueError, match="type=size"):
        parse_caps("image/*, *=1MB")


@pytest.mark.parametrize("text", ["", "image", "image/", "/png", "ima ge/png", 5, None,
                                  "image/png;x=1"])
def test_a_bad_type_pattern_is_refused(text):
    with pytest.raises(ValueError, match="a media type is like"):
        check_pattern(text)


def test_a_content_type_is_read_as_its_media_type():
    assert media_type_of("Image/PNG; charset=binary") == "image/png"
    assert media_type_of(None) == media_type_of("") == "application/octet-stream"
    assert wanted(("image/*",), "image/webp") and not wanted(("image/*",), "text/html")


def test_a_handlers_download_names_a_known_kind_and_good_types():
    assert media_request("document", None) == {"kind": "document"}
    assert media_request("image", "image/png") == {"kind": "image", "types": ["image/png"]}
    with pytest.raises(ValueError, match="kind must be one of"):
        media_request("photo", None)
    with pytest.raises(ValueError, match="at least one"):
        media_request("image", [])
    assert media_request("video", None, "yt-dlp") == {"kind": "video", "tool": "yt-dlp"}
    with pytest.raises(ValueError, match="tool must be one of"):
        media_request("video", None, "curl")
