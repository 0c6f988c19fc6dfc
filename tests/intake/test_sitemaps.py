"""Sitemap producer: discovery, the formats end to end, --since/--max-urls, dedupe, hostile
input, CLI. Parsing alone (no services) is tests/intake/test_sitemap_files.py.

Each test serves its sitemaps from a fresh loopback :class:`TestSite` (``sitemap_site``)
rather than the session site: these tests need their own ``/robots.txt``, and a route set on
the session site would stay for every later test of the session.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator

import pytest

from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.intake.producer import Producer
from common.intake.sitemaps import (
    MAX_INDEX_DEPTH,
    SitemapReader,
    SiteReport,
    parse_since,
    produce_site,
)
from common.store.keys import robots_key
from devtools.testsite import TestSite
from tests.helpers import drain, queue_depth
from tests.intake.sitemap_bodies import NS, billion_laughs, gzip_bomb, index, urlset

QUEUES = ("url_queue_ttl", "priority_queue", "failed_urls")


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def sitemap_site() -> Iterator[TestSite]:
    with TestSite(pages=5) as site:
        yield site


def serve(site: TestSite, path: str, body: bytes, content_type: str = "application/xml",
          headers: dict[str, str] | None = None) -> None:
    response_headers = {"Content-Type": content_type, **(headers or {})}
    site.route(path, lambda _record: (200, response_headers, body))


def pages(site: TestSite, prefix: str, n: int) -> list[str]:
    return [site.url(f"/{prefix}/{i}") for i in range(n)]


def published(amqp_channel) -> list[str]:
    """URLs of every message now in the work queues (drained)."""
    urls = []
    for queue in ("url_queue_ttl", "priority_queue"):
        urls += [WorkMessage.from_json(body).url for _m, _p, body in drain(amqp_channel, queue)]
    return urls


def read_site(settings: Settings, redis_client, target: str, **options) -> SiteReport:
    """One site through SitemapReader + Producer, in this process."""
    reader = SitemapReader(settings, redis_client)
    with Producer(settings, redis_client) as producer:
        return produce_site(target, reader, producer, **options)


# -- discovery and formats --------------------------------------------------------------------


def test_robots_index_leads_to_plain_and_gzipped_children_whatever_their_names(
        settings, redis_client, amqp_channel, sitemap_site):
    site = sitemap_site
    site.route("/robots.txt", lambda _r: (200, {"Content-Type": "text/plain"},
                                          f"User-agent: *\nDisallow: /private\n"
                                          f"Sitemap: {site.url('/index.xml')}\n".encode()))
    plain, gz, disguised, encoded = (pages(site, p, 3) for p in ("a", "b", "c", "d"))
    serve(site, "/index.xml", index(site.url("/plain.xml"), site.url("/child.xml.gz"),
                                    "/disguised.xml", site.url("/encoded.xml")))
    serve(site, "/plain.xml", urlset(*plain))
    serve(site, "/child.xml.gz", gzip.compress(urlset(*gz)), "application/gzip")
    serve(site, "/disguised.xml", gzip.compress(urlset(*disguised)))  # gzip, no .gz name
    serve(site, "/encoded.xml", gzip.compress(urlset(*encoded)),
          headers={"Content-Encoding": "gzip"})

    report = read_site(settings, redis_client, site.url("/"))

    assert report.errors == []
    assert report.sitemaps == 5
    assert sorted(published(amqp_channel)) == sorted(plain + gz + disguised + encoded)
    assert (report.summary.read, report.summary.new) == (12, 12)
    assert site.count("/robots.txt") == 1


def test_site_without_sitemap_lines_in_robots_falls_back_to_sitemap_xml(
        settings, redis_client, amqp_channel, sitemap_site):
    urls = pages(sitemap_site, "a", 2)
    serve(sitemap_site, "/sitemap.xml", urlset(*urls))  # robots.txt answers 404

    report = read_site(settings, redis_client, sitemap_site.base_url)

    assert (report.sitemaps, report.errors) == (1, [])
    assert sorted(published(amqp_channel)) == urls


def test_site_with_no_sitemap_at_all_is_one_clear_error(settings, redis_client, sitemap_site):
    report = read_site(settings, redis_client, sitemap_site.url("/"))

    assert report.sitemaps == 0
    [error] = report.errors
    assert "no sitemap found" in error and "HTTP 404" in error


def test_robots_txt_the_reader_fetched_is_stored_for_the_fleet(settings, redis_client,
                                                               sitemap_site):
    site = sitemap_site
    site.route("/robots.txt", lambda _r: (200, {"Content-Type": "text/plain"},
                                          b"User-agent: *\nDisallow: /private\n"))
    serve(site, "/sitemap.xml", urlset(*pages(site, "a", 2)))

    first = read_site(settings, redis_client, site.url("/"))
    second = read_site(settings, redis_client, site.url("/"))  # a new reader: Redis, not memory

    assert (first.errors, second.errors) == ([], [])
    assert site.count("/robots.txt") == 1
    stored = json.loads(redis_client.get(robots_key(site.base_url)))
    assert (stored["status"], stored["body"]) == ("ok", "User-agent: *\nDisallow: /private\n")


def test_a_site_the_address_guard_refuses_is_one_error_and_stores_no_robots_entry(
        settings, redis_client, sitemap_site):
    report = read_site(settings.with_overrides(fetch_allow_networks=()), redis_client,
                       sitemap_site.url("/"))

    [error] = report.errors
    assert "no sitemap found" in error and "fetch failed (blocked)" in error
    assert sitemap_site.log == []
    # Nothing is known about the site: no "unavailable" entry for the workers to retry on.
    assert redis_client.get(robots_key(sitemap_site.base_url)) is None


def test_sitemap_url_given_directly_is_read_without_robots_txt(
        settings, redis_client, amqp_channel, sitemap_site):
    urls = pages(sitemap_site, "a", 3)
    serve(sitemap_site, "/maps/direct.xml", urlset(*urls))

    report = read_site(settings, redis_client, sitemap_site.url("/maps/direct.xml"))

    assert (report.sitemaps, report.errors) == (1, [])
    assert sorted(published(amqp_channel)) == urls
    assert sitemap_site.count("/robots.txt") == 0


def test_text_sitemap_gives_one_url_a_line_and_skips_other_lines(
        settings, redis_client, amqp_channel, sitemap_site):
    urls = pages(sitemap_site, "t", 3)
    body = ("\ufeff" + "\r\n".join([urls[0], "", "not a url", urls[1], "  " + urls[2] + "  "])
            ).encode()
    serve(sitemap_site, "/urls.txt", body, "text/plain")

    report = read_site(settings, redis_client, sitemap_site.url("/urls.txt"))

    assert report.errors == []
    assert sorted(published(amqp_channel)) == urls


def test_rss_and_atom_feeds_give_their_item_links(settings, redis_client, amqp_channel,
                                                  sitemap_site):
    site = sitemap_site
    rss = (f'<?xml version="1.0"?><rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom">'
           f'<channel><title>T</title><link>{site.url("/")}</link>'
           f'<atom:link href="{site.url("/rss.xml")}" rel="self"/>'
           f'<item><title>1</title><link>{site.url("/r/1")}</link>'
           f'<pubDate>Wed, 01 May 2024 10:00:00 GMT</pubDate></item>'
           f'<item><guid>{site.url("/r/2")}</guid></item></channel></rss>').encode()
    atom = (f'<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>T</title>'
            f'<link rel="self" href="/atom.xml"/>'
            f'<entry><link rel="edit" href="/edit/1"/><link href="/f/1"/>'
            f'<updated>2024-05-01T10:00:00Z</updated></entry>'
            f'<entry><link rel="alternate" href="{site.url("/f/2")}"/></entry></feed>').encode()
    serve(site, "/rss.xml", rss, "application/rss+xml")
    serve(site, "/atom.xml", atom, "application/atom+xml")
    serve(site, "/index.xml", index("/rss.xml", "/atom.xml"))

    report = read_site(settings, redis_client, site.url("/index.xml"))

    assert (report.sitemaps, report.errors) == (3, [])
    assert sorted(published(amqp_channel)) == sorted(
        [site.url("/r/1"), site.url("/r/2"), site.url("/f/1"), site.url("/f/2")])


# -- --since, --max-urls, dedupe, rate limit --------------------------------------------------


def test_since_keeps_newer_and_undated_urls_and_skips_unchanged_child_sitemaps(
        settings, redis_client, amqp_channel, sitemap_site):
    site = sitemap_site
    serve(site, "/index.xml", index((site.url("/old.xml"), "2023-01-01"),
                                    (site.url("/new.xml"), "2024-06-01T08:00:00+00:00"),
                                    site.url("/undated.xml")))
    serve(site, "/old.xml", urlset(site.url("/o/1")))
    serve(site, "/new.xml", urlset((site.url("/n/old"), "2024-04-30"),
                                   (site.url("/n/same-day"), "2024-05-01"),
                                   (site.url("/n/later"), "2024-05-02T10:00:00+02:00"),
                                   site.url("/n/undated"),
                                   (site.url("/n/bad-date"), "someday")))
    serve(site, "/undated.xml", urlset(site.url("/u/1")))

    report = read_site(settings, redis_client, site.url("/index.xml"),
                       since=parse_since("2024-05-01"))

    assert report.errors == []
    assert report.filtered == 1
    assert sorted(published(amqp_channel)) == sorted(
        site.url(p) for p in ("/n/same-day", "/n/later", "/n/undated", "/n/bad-date", "/u/1"))
    assert site.count("/old.xml") == 0


def test_a_second_run_publishes_nothing_new(settings, redis_client, amqp_channel,
                                            sitemap_site):
    urls = pages(sitemap_site, "a", 20)
    serve(sitemap_site, "/sitemap.xml", urlset(*urls))

    first = read_site(settings, redis_client, sitemap_site.url("/"))
    second = read_site(settings, redis_client, sitemap_site.url("/"))

    assert (first.summary.new, first.summary.duplicate) == (20, 0)
    assert (second.summary.new, second.summary.duplicate) == (0, 20)
    assert queue_depth(amqp_channel, "url_queue_ttl") == 20


def test_max_urls_caps_what_one_site_submits(settings, redis_client, amqp_channel,
                                             sitemap_site):
    site = sitemap_site
    serve(site, "/index.xml", index("/one.xml", "/two.xml", "/three.xml"))
    for name in ("one", "two", "three"):
        serve(site, f"/{name}.xml", urlset(*pages(site, name, 30)))

    report = read_site(settings, redis_client, site.url("/index.xml"), max_urls=40)

    assert report.summary.read == 40
    assert len(published(amqp_channel)) == 40
    assert site.count("/three.xml") == 0  # the cap was reached before it was needed


def test_priority_flag_sends_every_url_to_the_priority_queue(settings, redis_client,
                                                            amqp_channel, sitemap_site):
    serve(sitemap_site, "/s.xml", urlset(*pages(sitemap_site, "a", 3)))

    read_site(settings, redis_client, sitemap_site.url("/s.xml"), force_priority=True)

    assert queue_depth(amqp_channel, "priority_queue") == 3
    assert queue_depth(amqp_channel, "url_queue_ttl") == 0


def test_every_sitemap_fetch_takes_a_rate_limit_permit_and_waits_for_one(
        settings, redis_client, sitemap_site):
    site = sitemap_site
    serve(site, "/index.xml", index("/one.xml", "/two.xml"))
    serve(site, "/one.xml", urlset(site.url("/a/1")))
    serve(site, "/two.xml", urlset(site.url("/a/2")))

    report = read_site(settings.with_overrides(rate_limit=(2, 1000)), redis_client,
                       site.url("/index.xml"))

    assert report.errors == []
    times = [r.monotonic_s for r in site.log]
    assert len(times) == 3
    # 2 per second: the third fetch waited for its booked slot, about a second after the first.
    assert times[2] - times[0] >= 0.9


# -- hostile and broken input -----------------------------------------------------------------


def test_xxe_sitemap_cannot_read_a_local_file_or_fetch_a_dtd(run_cli, amqp_channel,
                                                            sitemap_site, tmp_path):
    site = sitemap_site
    secret = "s3cr3t-7f1c2e9a"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    uri = secret_file.as_uri()
    general = (f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY xxe SYSTEM "{uri}">]>'
               f'<urlset xmlns="{NS}"><url><loc>{site.url("/x/")}&xxe;</loc></url></urlset>')
    parameter = (f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY % p SYSTEM "{uri}"> %p;]>'
                 f'<urlset xmlns="{NS}"><url><loc>{site.url("/x/p")}</loc></url></urlset>')
    external_dtd = (f'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "{site.url("/evil.dtd")}">'
                    f'<urlset xmlns="{NS}"><url><loc>{site.url("/x/dtd")}&xxe;</loc></url></urlset>')
    site.route("/evil.dtd", lambda _r: (200, {"Content-Type": "application/xml-dtd"},
                                        f'<!ENTITY xxe SYSTEM "{uri}">'.encode()))
    serve(site, "/general.xml", general.encode())
    serve(site, "/parameter.xml", parameter.encode())
    serve(site, "/external.xml", external_dtd.encode())
    serve(site, "/index.xml", index("/general.xml", "/parameter.xml", "/external.xml"))

    result = run_cli("sitemap_producer.py", site.url("/index.xml"))

    bodies = [body for q in QUEUES for _m, _p, body in drain(amqp_channel, q)]
    assert all(secret.encode() not in body for body in bodies)
    assert secret not in result.stdout + result.stderr
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("DOCTYPE declares entities") == 2
    # The external DTD is never fetched, so its entity stays an unexpanded reference.
    assert site.count("/evil.dtd") == 0
    assert [WorkMessage.from_json(b).url for b in bodies] == [site.url("/x/dtd")]


def test_billion_laughs_sitemap_is_an_error_and_publishes_nothing(
        settings, redis_client, amqp_channel, sitemap_site):
    serve(sitemap_site, "/lol.xml", billion_laughs())

    report = read_site(settings, redis_client, sitemap_site.url("/lol.xml"))

    assert len(report.errors) == 1 and "entit" in report.errors[0].lower()
    assert report.summary.read == 0
    assert all(queue_depth(amqp_channel, q) == 0 for q in QUEUES)


def test_gzip_bombs_are_refused_not_inflated_and_the_other_sitemaps_still_count(
        settings, redis_client, amqp_channel, sitemap_site):
    site = sitemap_site
    zeros, xml = gzip_bomb(60), gzip_bomb(60, xml=True)
    assert len(zeros) < 200 * 1024 and len(xml) < 400 * 1024  # 60 MB each, inflated
    serve(site, "/zeros.xml.gz", zeros, "application/gzip")
    serve(site, "/xml-bomb.xml", xml, "application/octet-stream")
    serve(site, "/encoded-bomb.xml", xml, headers={"Content-Encoding": "gzip"})
    good = pages(site, "good", 2)
    serve(site, "/good.xml", urlset(*good))
    serve(site, "/index.xml", index("/zeros.xml.gz", "/xml-bomb.xml", "/encoded-bomb.xml",
                                    "/good.xml"))

    report = read_site(settings, redis_client, site.url("/index.xml"))

    assert len(report.errors) == 3
    assert all("50 MB" in error and "refused" in error for error in report.errors)
    assert report.sitemaps == 2  # the index and the good child
    assert sorted(published(amqp_channel)) == good  # not even the bomb's one <loc>


def test_malformed_sitemaps_are_reported_and_the_others_still_count(
        settings, redis_client, amqp_channel, sitemap_site):
    site = sitemap_site
    truncated = urlset(site.url("/bad/1"), site.url("/bad/2"))[:-30]
    serve(site, "/truncated.xml", truncated)
    serve(site, "/html.xml", b"<!DOCTYPE html><html><body><p>Not found</p></body></html>",
          "text/html")
    serve(site, "/broken.xml.gz", gzip.compress(urlset(site.url("/bad/3")))[:-12],
          "application/gzip")
    good = pages(site, "good", 2)
    serve(site, "/good.xml", urlset(*good))
    serve(site, "/index.xml", index("/truncated.xml", "/html.xml", "/missing.xml",
                                    "/broken.xml.gz", "/good.xml"))

    report = read_site(settings, redis_client, site.url("/index.xml"))

    errors = "\n".join(report.errors)
    assert len(report.errors) == 4, errors
    assert "truncated.xml: malformed XML" in errors
    assert "html.xml: not a sitemap or feed (root element <html>)" in errors
    assert "missing.xml: HTTP 404" in errors
    assert "broken.xml.gz: gzip data ends early" in errors
    assert sorted(published(amqp_channel)) == good  # nothing from the broken files


def test_index_loop_ends_with_each_sitemap_read_once(settings, redis_client, amqp_channel,
                                                     sitemap_site):
    site = sitemap_site
    serve(site, "/a.xml", index("/b.xml", "/a.xml", "/pages.xml"))
    serve(site, "/b.xml", index(site.url("/a.xml"), "/pages.xml"))
    serve(site, "/pages.xml", urlset(*pages(site, "p", 2)))

    report = read_site(settings, redis_client, site.url("/a.xml"))

    assert (report.sitemaps, report.errors) == (3, [])
    assert [site.count(p) for p in ("/a.xml", "/b.xml", "/pages.xml")] == [1, 1, 1]
    assert len(published(amqp_channel)) == 2


def test_indexes_nested_deeper_than_the_cap_are_an_error(settings, redis_client,
                                                         sitemap_site):
    site = sitemap_site
    for level in range(MAX_INDEX_DEPTH + 1):
        serve(site, f"/level{level}.xml", index(f"/level{level + 1}.xml"))

    report = read_site(settings, redis_client, site.url("/level0.xml"))

    assert report.sitemaps == MAX_INDEX_DEPTH + 1
    [error] = report.errors
    assert "nested deeper than" in error
    assert site.count(f"/level{MAX_INDEX_DEPTH + 1}.xml") == 0


# -- the command line -------------------------------------------------------------------------

SUMMARY = re.compile(r"site=(\S+) sitemaps=(\d+) errors=(\d+) filtered=(\d+) read=(\d+) "
                     r"new=(\d+) duplicate=(\d+) invalid=(\d+) failed=(\d+) "
                     r"priority_queue=(\d+) url_queue_ttl=(\d+)")


def test_cli_prints_one_summary_line_per_site_and_exits_0(run_cli, amqp_channel,
                                                          sitemap_site):
    site = sitemap_site
    site.route("/robots.txt", lambda _r: (200, {"Content-Type": "text/plain"},
                                          b"Sitemap: /from-robots.xml\n"))
    serve(site, "/from-robots.xml", urlset(*pages(site, "r", 3)))
    serve(site, "/direct.xml", urlset(*pages(site, "d", 2), site.url("/r/0")))

    result = run_cli("sitemap_producer.py", site.url("/"), site.url("/direct.xml"))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [SUMMARY.fullmatch(line).groups() for line in lines[:2]] == [
        (site.url("/"), "1", "0", "0", "3", "3", "0", "0", "0", "0", "3"),
        (site.url("/direct.xml"), "1", "0", "0", "3", "2", "1", "0", "0", "0", "2"),
    ]
    assert lines[2].startswith("total sites=2 sitemaps=2 errors=0 filtered=0 read=6 new=5 ")
    assert queue_depth(amqp_channel, "url_queue_ttl") == 5
    # Progress goes to stderr (a line every few seconds and one at the end when not a TTY).
    assert f"sitemaps {site.url('/direct.xml')}: done, 3 URLs in " in result.stderr


def test_cli_exits_1_when_a_sitemap_fails(run_cli, sitemap_site):
    serve(sitemap_site, "/index.xml", index("/gone.xml", "/ok.xml"))
    serve(sitemap_site, "/ok.xml", urlset(sitemap_site.url("/a/1")))

    result = run_cli("sitemap_producer.py", sitemap_site.url("/index.xml"), "--json")

    assert result.returncode == 1
    assert "gone.xml: HTTP 404" in result.stderr
    assert '"errors": ["' in result.stdout and '"new": 1' in result.stdout


@pytest.mark.parametrize("args", [
    ["--since", "last tuesday", "http://127.0.0.1:9/"],
    ["--max-urls", "0", "http://127.0.0.1:9/"],
    ["ftp://127.0.0.1:9/sitemap.xml"],
    [],
], ids=["bad-since", "bad-max-urls", "not-http", "no-target"])
def test_cli_exits_2_on_bad_arguments(run_cli, args):
    result = run_cli("sitemap_producer.py", *args)

    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_cli_exits_3_when_redis_cannot_be_reached(run_cli):
    result = run_cli("sitemap_producer.py", "http://127.0.0.1:9/",
                     env={"REDIS_URL": "redis://127.0.0.1:1/0", "CONNECT_RETRY_S": "0"})

    assert result.returncode == 3
    assert "Redis" in result.stderr
