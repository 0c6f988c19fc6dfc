from __future__ import annotations

import pytest

from common.core.errors import InvalidURL
from common.core.urls import canonicalize, domain_of, fingerprint


@pytest.mark.parametrize("raw, canonical", [
    ("http://Example.COM:80/a?b=2&a=1#frag", "http://example.com/a?a=1&b=2"),
    ("https://example.com:443", "https://example.com/"),
    ("https://example.com:8443/x", "https://example.com:8443/x"),
    ("  http://example.com/path with%20space  ".replace(" with", "%20with"),
     "http://example.com/path%20with%20space"),
    ("HTTP://bücher.example/", "http://xn--bcher-kva.example/"),
])
def test_equivalent_urls_canonicalise_to_one_form(raw, canonical):
    assert canonicalize(raw) == canonical


@pytest.mark.parametrize("raw", [
    "", "   ", "ftp://example.com/", "example.com/page", "http://", "http:///path",
    "javascript:alert(1)", "http://user:pw@example.com/", "http://exa mple.com/",
    "http://example.com:99999/", "http://ex..ample.com/",
])
def test_invalid_urls_are_rejected_with_a_reason(raw):
    with pytest.raises(InvalidURL):
        canonicalize(raw)


def test_overlong_url_is_rejected():
    with pytest.raises(InvalidURL, match="longer"):
        canonicalize("http://example.com/" + "a" * 3000, max_length=2048)


def test_fingerprint_is_stable_and_splits_into_bucket_and_member():
    fp = fingerprint("http://example.com/")
    assert fp == fingerprint("http://example.com/")
    assert fp != fingerprint("http://example.com/x")
    assert 0 <= fp.bucket(16384) < 16384
    assert -(2 ** 63) <= fp.member < 2 ** 63
    assert len(fp.hex) == 32


def test_domain_is_the_lowercase_host_without_port():
    assert domain_of("http://Example.com:8080/a") == "example.com"
