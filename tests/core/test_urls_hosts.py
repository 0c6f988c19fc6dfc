"""One host, one domain: a trailing dot and the numeric forms of an IPv4 address are
canonicalised as a browser's URL parser does (WHATWG host parsing), before dedupe and every
per-domain key (issue 23). Loopback addresses only: nothing here sends traffic."""

from __future__ import annotations

import random

import pytest

from common.core.errors import InvalidURL
from common.core.urls import canonicalize, domain_of, fingerprint
from common.store import keys
from common.web.robots import origin_of

LOOPBACK_FORMS = ["127.0.0.1", "127.0.0.1.", "127.1", "127.0.1", "2130706433", "0177.0.0.1",
                  "0x7f.1", "0x7F.0.0.0x1", "0x7f000001", "017700000001", "127.00.0.01"]


def _per_domain_keys(url: str) -> tuple[str, ...]:
    domain = domain_of(url)
    return (keys.rate_log_key(domain), keys.rate_slot_key(domain), keys.throttle_key(domain),
            keys.crawl_pages_key(domain), keys.deferred_next_key(domain),
            keys.robots_key(origin_of(canonicalize(url))))


def test_every_form_of_a_loopback_address_is_one_url_one_fingerprint_and_one_domain():
    urls = [f"http://{host}:8080/page?b=2&a=1" for host in LOOPBACK_FORMS]
    assert {canonicalize(url) for url in urls} == {"http://127.0.0.1:8080/page?a=1&b=2"}
    assert len({fingerprint(canonicalize(url)).hex for url in urls}) == 1
    assert {domain_of(url) for url in urls} == {"127.0.0.1"}
    assert len({_per_domain_keys(url) for url in urls}) == 1


def test_a_trailing_dot_is_the_same_domain_for_dedupe_and_every_key():
    plain, dotted = "http://example.com/a", "http://Example.COM./a"
    assert canonicalize(dotted) == canonicalize(plain) == "http://example.com/a"
    assert domain_of(dotted) == domain_of(plain) == "example.com"
    assert _per_domain_keys(dotted) == _per_domain_keys(plain)


def test_an_ipv6_address_is_written_compressed():
    assert canonicalize("http://[0:0:0::1]:8080/") == "http://[::1]:8080/"
    assert domain_of("http://[0:0:0::1]/") == domain_of("http://[::1]/") == "::1"


@pytest.mark.parametrize("host", ["1.2.example", "x.1a", "www.0day", "example.com"])
def test_a_name_whose_last_label_is_not_a_number_stays_a_name(host):
    assert canonicalize(f"http://{host}/") == f"http://{host}/"
    assert domain_of(f"http://{host}/") == host


@pytest.mark.parametrize("host", ["127.0.0.1.2", "256.0.0.1", "127.0.0.256", "127.16777216",
                                  "4294967296", "foo.127", "127.0.0.09"])
def test_a_host_that_ends_in_a_number_but_is_no_ipv4_address_is_an_invalid_url(host):
    with pytest.raises(InvalidURL):
        canonicalize(f"http://{host}/")


def _random_form(rng: random.Random, octets: list[int]) -> str:
    """``octets`` written as a browser would still read them: 1 to 4 parts (the last one
    holding the remaining bytes), each decimal, octal or hex, maybe a trailing dot."""
    count = rng.randint(1, 4)
    values = octets[:count - 1] + [int.from_bytes(bytes(octets[count - 1:]), "big")]
    parts = []
    for value in values:
        style = rng.choice(["dec", "oct", "hex", "HEX"])
        if style == "oct" and value:
            parts.append("0" + "0" * rng.randint(0, 2) + format(value, "o"))
        elif style == "hex":
            parts.append("0x" + "0" * rng.randint(0, 2) + format(value, "x"))
        elif style == "HEX":
            parts.append("0X" + format(value, "X"))
        else:
            parts.append(str(value))
    return ".".join(parts) + ("." if rng.random() < 0.3 else "")


def test_generated_forms_of_loopback_addresses_all_canonicalise_to_their_dotted_quad():
    rng = random.Random(23)
    for _ in range(2000):
        octets = [127, rng.randrange(256), rng.randrange(256), rng.randrange(256)]
        form = _random_form(rng, octets)
        quad = ".".join(map(str, octets))
        url = f"http://{form}/x"
        assert canonicalize(url) == f"http://{quad}/x", form
        assert domain_of(url) == quad, form


# --- hosts written in settings and rules ---------------------------------------------------


def test_a_host_in_rate_limits_is_the_host_a_link_has() -> None:
    from common.core.values import rate_overrides

    overrides = dict(rate_overrides("Example.COM.=5/second,2130706433=1/second"))
    assert set(overrides) == {"example.com", "127.0.0.1"}
    assert domain_of("http://example.com./a") in overrides
    assert domain_of("http://127.1/") in overrides


def test_a_host_in_rules_and_routing_is_the_host_a_link_has() -> None:
    from common.core.errors import ConfigError
    from common.intake.routing import Router
    from common.work.rules_file import load_rules

    rules = load_rules('[{"host": "0x7f.1", "fields": {"t": "title"}, '
                       '"follow": {"domains": ["Shop.Example."]}}]')
    assert rules[0].host == "127.0.0.1"
    assert rules[0].follow.domains == ("shop.example",)
    routing = Router.from_setting('[{"host": "Shop.Example.", "queue": "priority"}]')
    assert routing.rules[0].host == "shop.example"
    with pytest.raises(ConfigError, match="host"):
        load_rules('[{"host": "256.0.0.1", "fields": {"t": "title"}}]')
