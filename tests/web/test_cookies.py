"""The cookie jar (common/web/cookies.py): RFC 6265's rules through http.cookiejar, its bounds,
its Redis form and what a page changed."""

from __future__ import annotations

import json
import time

from common.web.cookies import MAX_COOKIE_BYTES, Jar

SITE = "http://shop.example/"


def _reloaded(jar: Jar) -> Jar:
    """The jar as another worker reads it back from Redis (its saved fields)."""
    changed, gone = jar.changes()
    assert not gone
    return Jar(changed, max_cookies=jar.max_cookies, max_bytes=jar.max_bytes)


def test_a_cookie_set_by_a_page_goes_back_with_the_next_page_of_the_site():
    jar = Jar()
    jar.receive("http://shop.example/a", ["sid=abc; Path=/"])
    assert jar.header_for("http://shop.example/b/c") == "sid=abc"


def test_a_jar_sends_nothing_to_another_site_nor_keeps_what_a_page_sets_for_one():
    jar = Jar()
    jar.receive("http://shop.example/", ["sid=abc; Path=/", "evil=1; Domain=other.example"])
    assert jar.header_for("http://other.example/") is None
    assert jar.header_for("http://shop.example.other.example/") is None
    assert jar.header_for("http://shop.example/") == "sid=abc"
    assert len(jar) == 1


def test_a_domain_cookie_goes_to_subdomains_and_a_host_cookie_does_not():
    jar = Jar()
    jar.receive("http://www.shop.example/", ["d=1; Domain=shop.example; Path=/", "h=2; Path=/"])
    assert jar.header_for("http://img.shop.example/") == "d=1"
    assert sorted(jar.header_for("http://www.shop.example/").split("; ")) == ["d=1", "h=2"]


def test_a_cookie_goes_only_under_its_path():
    jar = Jar()
    jar.receive("http://shop.example/", ["cart=9; Path=/cart"])
    assert jar.header_for("http://shop.example/cart/view") == "cart=9"
    assert jar.header_for("http://shop.example/cartoon") is None
    assert jar.header_for("http://shop.example/") is None


def test_a_secure_cookie_goes_over_https_only():
    jar = Jar()
    jar.receive("https://shop.example/", ["s=1; Secure; Path=/"])
    assert jar.header_for("https://shop.example/x") == "s=1"
    assert jar.header_for("http://shop.example/x") is None


def test_an_expired_cookie_is_neither_kept_nor_sent():
    jar = Jar()
    jar.receive(SITE, ["old=1; Path=/; Expires=Wed, 01 Jan 2020 00:00:00 GMT",
                       "soon=2; Path=/; Max-Age=1"])
    assert jar.header_for(SITE) == "soon=2"
    reloaded = _reloaded(jar)
    time.sleep(1.1)
    assert reloaded.header_for(SITE) is None
    assert Jar(jar.changes()[0]).header_for(SITE) is None  # loaded after its expiry


def test_max_age_zero_deletes_the_cookie_and_the_deletion_is_a_change_to_write():
    jar = Jar()
    jar.receive(SITE, ["sid=abc; Path=/", "lang=en; Path=/"])
    stored = jar.changes()[0]
    again = Jar(stored)
    again.receive(SITE, ["sid=gone; Path=/; Max-Age=0"])
    assert again.header_for(SITE) == "lang=en"
    changed, gone = again.changes()
    assert changed == {} and gone == ["shop.example;/;sid"]


def test_httponly_and_samesite_are_kept_through_redis():
    jar = Jar()
    jar.receive(SITE, ["sid=abc; Path=/; HttpOnly; SameSite=Strict"])
    (field, value), = jar.changes()[0].items()
    assert field == "shop.example;/;sid"
    stored = json.loads(value)
    assert stored["r"] == {"HttpOnly": None, "SameSite": "Strict"}
    # Every request of the fleet is a top-level visit of the site: Strict cookies go too.
    assert _reloaded(jar).header_for("http://shop.example/other") == "sid=abc"


def test_a_cookie_over_4096_bytes_is_never_kept():
    jar = Jar()
    jar.receive(SITE, ["big=" + "x" * MAX_COOKIE_BYTES, "small=1"])
    assert jar.header_for(SITE) == "small=1"
    assert list(jar.changes()[0]) == ["shop.example;/;small"]


def test_past_the_cookie_bound_the_oldest_go_first():
    jar = Jar(max_cookies=3)
    for n in range(5):
        jar.receive(SITE, [f"c{n}={n}; Path=/"])
        time.sleep(0.002)  # distinct creation times
    assert sorted(jar.header_for(SITE).split("; ")) == ["c2=2", "c3=3", "c4=4"]


def test_past_the_byte_bound_the_oldest_go_first():
    jar = Jar(max_bytes=2100)
    jar.receive(SITE, ["a=" + "1" * 1000 + "; Path=/"])
    time.sleep(0.002)
    jar.receive(SITE, ["b=" + "2" * 1000 + "; Path=/"])
    time.sleep(0.002)
    jar.receive(SITE, ["c=3; Path=/"])
    names = sorted(pair.split("=")[0] for pair in jar.header_for(SITE).split("; "))
    assert names == ["a", "b", "c"]
    jar.receive(SITE, ["d=" + "4" * 200 + "; Path=/"])
    names = sorted(pair.split("=")[0] for pair in jar.header_for(SITE).split("; "))
    assert names == ["b", "c", "d"]


def test_a_jar_loaded_over_its_bound_drops_its_oldest_and_writes_that():
    jar = Jar()
    for n in range(4):
        jar.receive(SITE, [f"c{n}={n}; Path=/"])
        time.sleep(0.002)
    small = Jar(jar.changes()[0], max_cookies=2)
    assert sorted(small.header_for(SITE).split("; ")) == ["c2=2", "c3=3"]
    assert sorted(small.changes()[1]) == ["shop.example;/;c0", "shop.example;/;c1"]


def test_the_redis_form_round_trips_every_attribute():
    jar = Jar()
    jar.receive("https://shop.example/a/b", [
        "sid=abc; Path=/; Secure; HttpOnly", "d=1; Domain=shop.example; Max-Age=3600",
        "p=2"])
    stored = jar.changes()[0]
    again = Jar(stored)
    assert again.changes() == ({}, [])  # loaded as it was: nothing to write
    for url in ("https://shop.example/a/x", "http://shop.example/a/x", "https://www.shop.example/"):
        assert again.header_for(url) == jar.header_for(url)
    assert sorted(stored) == [".shop.example;/a;d", "shop.example;/;sid", "shop.example;/a;p"]


def test_a_page_that_set_nothing_changes_nothing():
    jar = Jar()
    jar.receive(SITE, ["sid=abc; Path=/"])
    loaded = Jar(jar.changes()[0])
    loaded.header_for(SITE)
    loaded.receive(SITE, [])
    assert loaded.changes() == ({}, [])


def test_a_cookie_set_again_with_the_same_value_is_not_a_change():
    jar = Jar()
    jar.receive(SITE, ["sid=abc; Path=/"])
    loaded = Jar(jar.changes()[0])
    loaded.receive(SITE, ["sid=abc; Path=/"])
    assert loaded.changes() == ({}, [])
    loaded.receive(SITE, ["sid=new; Path=/"])
    assert list(loaded.changes()[0]) == ["shop.example;/;sid"]


def test_an_unreadable_stored_cookie_is_dropped_not_fatal():
    jar = Jar({b"shop.example;/;x": b"{not json", b"!login": b'{"ok": true}'})
    assert jar.header_for(SITE) is None
    assert jar.meta == {"!login": '{"ok": true}'}
    assert jar.changes() == ({}, ["shop.example;/;x"])


def test_no_repr_of_a_jar_shows_a_value():
    jar = Jar()
    jar.receive(SITE, ["sid=s3cr3t-value; Path=/"])
    assert "s3cr3t" not in repr(jar) and "s3cr3t" not in str(jar)


def test_localhost_and_ip_sites_keep_their_cookies():
    for url in ("http://localhost:8080/a", "http://127.0.0.1:8080/a"):
        jar = Jar()
        jar.receive(url, ["sid=1; Path=/"])
        assert _reloaded(jar).header_for(url.replace("/a", "/b")) == "sid=1"


def test_warc_header_lines_keep_cookie_names_and_attributes_but_no_value():
    from common.web.capture import _no_cookie_values

    assert _no_cookie_values(b"Cookie: sid=abc; lang=en") == \
        b"Cookie: sid=[redacted]; lang=[redacted]"
    assert _no_cookie_values(b"set-cookie: sid=abc; Path=/; Secure\r\n") == \
        b"set-cookie: sid=[redacted]; Path=/; Secure\r\n"
    assert _no_cookie_values(b"Proxy-Authorization: Basic dTpw") == \
        b"Proxy-Authorization: [redacted]"
    assert _no_cookie_values(b"Cookiejar: x=1") == b"Cookiejar: x=1"
    assert _no_cookie_values(b"GET /?Cookie: x HTTP/1.1") == b"GET /?Cookie: x HTTP/1.1"
