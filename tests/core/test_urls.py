from __future__ import annotations

import random
import re

import pytest

from common.core import urls
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


def test_a_url_already_canonical_is_returned_as_it_is_and_the_shortcut_agrees_with_w3lib():
    # canonicalize returns URLs of the commonest canonical shape without w3lib; generated
    # URLs near that shape (default and odd ports, IPv4 forms, dot segments, upper case,
    # queries, escapes) must come out exactly as the full path makes them, or fail alike.
    rng = random.Random(20261127)
    hosts = ["a.com", "A.com", "127.0.0.2", "127.1", "0x7f.0.0.1", "2130706433", "1.2.3.4.5",
             "a-b.example", "a..b", "x" * 64 + ".com", "b.com.", "xn--e1afmkfd.com", "a"]
    ports = ["", ":80", ":443", ":8080", ":0080", ":65535", ":65536", ":99999", ":1"]
    parts = ["p", "31.html", ".", "..", "", "~x", "a-b_c.d", "%41", "%7e", "Q", "é", ".well"]
    for _ in range(20_000):
        path = "/".join(rng.choice(parts) for _ in range(rng.randint(0, 4)))
        url = (f"{rng.choice(['http', 'https', 'HTTP'])}://{rng.choice(hosts)}"
               f"{rng.choice(ports)}/{path}{rng.choice(['', '', '?b=1&a=2', '#f'])}")
        try:
            expected = urls._canonicalize(url, 2048)
        except InvalidURL as exc:
            with pytest.raises(InvalidURL, match=re.escape(str(exc))):
                canonicalize(url)
            continue
        assert canonicalize(url) == expected, url
    assert urls._CANONICAL_SHAPE.fullmatch("http://127.0.0.2:8080/p/31.html")  # the shortcut
