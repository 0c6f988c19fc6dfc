"""Hostile and broken responses through the real worker: each URL gets exactly one outcome.

Real RabbitMQ and Redis (fixtures in conftest.py), the loopback test site with extra routes,
a Worker in a thread. Whatever a page does, the worker records it or dead-letters it with a
named failure; it never crashes and never produces a ``worker_error`` dead letter.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from common.broker import topology
from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from devtools.testsite import RequestRecord, TestSite
from tests.helpers import WorkerThread, drain, queue_depth, results, wait_for

FAILED = topology.FAILED_QUEUE
HTML_UTF8 = "text/html; charset=utf-8"

BROKEN_HTML = (
    b"<html><head><title>Broken page</title><body><div><p>unclosed <a href='/page/2'>two"
    b"<table><tr><td>garbage &&& <<<>>> &#xFFFFFFF; &bogus; </b></i></html></div></td>"
    b"<a href=\"/page/3\">three<p <p <<a>> =\"x\" <script>var s = '<a href=\"/nope\">';"
)
LATIN1_HTML = ("<!DOCTYPE html><html><head><title>Café crème</title></head>"
               "<body><p>Un café crème à côté, s'il vous plaît.</p></body></html>"
               ).encode("latin-1")
MANY_LINKS = 50_000
MANY_LINKS_HTML = ("<html><head><title>Many links</title></head><body>"
                   + "".join(f'<a href="/many/{i}">{i}</a> ' for i in range(MANY_LINKS))
                   + "</body></html>").encode()
DEEP_HTML = ("<html><head><title>Deep</title></head><body>" + "<div>" * 50_000 + "deep"
             + "</div>" * 50_000 + "</body></html>").encode()
BAD_LINKS_HTML = (b'<html><head><title>Bad links</title></head><body>'
                  b'<a href="http://[::1">a</a><a href="http://a:b:c/">b</a>'
                  b'<a href="http://%zz/">c</a><a href="javascript:alert(1)">d</a>'
                  b'<a href="' + b"x" * 100_000 + b'">e</a><a href="http://\xff\xfe/">f</a>'
                  b'<a href="/page/4">ok</a></body></html>')

#: path -> (Content-Type or None, extra headers, body)
HOSTILE_ROUTES: dict[str, tuple[str | None, dict[str, str], bytes]] = {
    "/t-hostile/broken": (HTML_UTF8, {}, BROKEN_HTML),
    "/t-hostile/wrong-charset": (HTML_UTF8, {}, LATIN1_HTML),  # says UTF-8, is Latin-1
    "/t-hostile/undeclared-latin1": ("text/html", {}, LATIN1_HTML),
    "/t-hostile/binary-as-html": (HTML_UTF8, {}, random.Random(7).randbytes(16_384)),
    "/t-hostile/many-links": (HTML_UTF8, {}, MANY_LINKS_HTML),
    "/t-hostile/deep": (HTML_UTF8, {}, DEEP_HTML),
    "/t-hostile/bad-links": (HTML_UTF8, {}, BAD_LINKS_HTML),
    "/t-hostile/empty": (HTML_UTF8, {}, b""),
    "/t-hostile/no-type": (None, {}, b"<html><title>No type</title><p>sniff me</p></html>"),
    "/t-hostile/png-lie": ("image/png", {}, b"<html><title>Not read</title></html>"),
    "/t-hostile/corrupt-gzip": (HTML_UTF8, {"Content-Encoding": "gzip"},
                                b"\x1f\x8b\x08\x00" + b"definitely not deflate data" * 20),
}


def _static(content_type: str | None, headers: dict[str, str], body: bytes) -> Callable:
    all_headers = dict(headers)
    if content_type is not None:
        all_headers["Content-Type"] = content_type

    def handler(_record: RequestRecord) -> tuple[int, dict[str, str], bytes]:
        return 200, all_headers, body

    return handler


def _install_routes(site: TestSite) -> dict[str, str]:
    """Register the hostile routes; returns {path: canonical URL}."""
    for path, (content_type, headers, body) in HOSTILE_ROUTES.items():
        site.route(path, _static(content_type, headers, body))
    paths = [*HOSTILE_ROUTES, "/nocharset", "/latin1"]
    return {path: canonicalize(site.url(path)) for path in paths}


def _seed(settings: Settings, redis_client: Any, urls: list[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _run_until_every_url_has_an_outcome(settings: Settings, redis_client: Any, channel: Any,
                                        count: int, timeout_s: float = 30.0) -> None:
    def settled() -> bool:
        return len(results(redis_client)) + queue_depth(channel, FAILED) >= count

    with WorkerThread(settings) as worker:
        reached = wait_for(settled, timeout_s)
    assert worker.exit_code == 0
    assert reached, (f"{len(results(redis_client))} results and "
                     f"{queue_depth(channel, FAILED)} dead letters for {count} URLs")


def _outcomes(redis_client: Any, channel: Any) -> tuple[dict[str, dict], dict[str, dict]]:
    """({url: result record}, {url: dead-letter headers}); fails on any URL seen twice."""
    records: dict[str, dict] = {}
    for record in results(redis_client):
        assert record["url"] not in records, f"{record['url']} recorded twice"
        records[record["url"]] = record
    dead: dict[str, dict] = {}
    for _method, props, body in drain(channel, FAILED):
        assert props.headers["reason"] != "worker_error", (props.headers, body)
        url = json.loads(body)["url"]
        assert url not in dead and url not in records, f"{url} has two outcomes"
        dead[url] = props.headers
    return records, dead


def test_hostile_pages_are_recorded_or_dead_lettered_without_crashing_the_worker(
        settings, redis_client, amqp_channel, site):
    urls = _install_routes(site)
    _seed(settings, redis_client, list(urls.values()))
    _run_until_every_url_has_an_outcome(
        settings.with_overrides(concurrency=4, crawl_enabled=False), redis_client,
        amqp_channel, len(urls))

    records, dead = _outcomes(redis_client, amqp_channel)
    assert set(records) | set(dead) == set(urls.values())
    assert set(dead) == {urls["/t-hostile/corrupt-gzip"]}
    assert dead[urls["/t-hostile/corrupt-gzip"]]["failure"] == "fetch_invalid"
    assert all(r["status"] == 200 for r in records.values())

    broken = records[urls["/t-hostile/broken"]]
    assert broken["title"] == "Broken page" and broken["error"] is None
    assert {site.page_url(2), site.page_url(3)} <= set(broken["links"])
    assert site.url("/nope") not in broken["links"]  # inside a <script>

    # Header says UTF-8, bytes are Latin-1: either decoded by a fallback or with U+FFFD,
    # but recorded either way.
    for path in ("/t-hostile/wrong-charset", "/t-hostile/undeclared-latin1"):
        assert records[urls[path]]["title"] in ("Café crème", "Caf\ufffd cr\ufffdme"), path
    assert records[urls["/t-hostile/undeclared-latin1"]]["title"] == "Café crème"
    assert records[urls["/nocharset"]]["title"] == "Naïve résumé"
    assert records[urls["/latin1"]]["title"] == "Café Latin-1"

    binary = records[urls["/t-hostile/binary-as-html"]]
    assert binary["error"].startswith("not_html") and "title" not in binary
    assert binary["bytes"] == 16_384

    many = records[urls["/t-hostile/many-links"]]
    assert many["title"] == "Many links" and many["links_truncated"] is True
    assert 0 < len(many["links"]) < MANY_LINKS
    assert many["links"][0] == site.url("/many/0")

    assert records[urls["/t-hostile/deep"]]["title"] == "Deep"
    assert site.page_url(4) in records[urls["/t-hostile/bad-links"]]["links"]
    assert records[urls["/t-hostile/empty"]]["bytes"] == 0
    assert records[urls["/t-hostile/no-type"]]["title"] == "No type"
    png = records[urls["/t-hostile/png-lie"]]
    assert png["skipped"] == "content_type" and png["bytes"] == 0 and "title" not in png

    # Every URL was fetched once: nothing was retried, nothing crashed mid-way.
    for path in urls:
        assert site.count(path) == 1, path


def test_a_fetch_refused_by_the_guard_is_dead_lettered_as_fetch_blocked(
        settings, redis_client, amqp_channel, site):
    url = canonicalize(site.page_url(7))
    _seed(settings, redis_client, [url])
    _run_until_every_url_has_an_outcome(
        settings.with_overrides(fetch_allow_networks=(), robots_enabled=False),
        redis_client, amqp_channel, 1)

    records, dead = _outcomes(redis_client, amqp_channel)
    assert records == {} and set(dead) == {url}
    headers = dead[url]
    assert headers["failure"] == "fetch_blocked" and headers["reason"] == "fetch_blocked"
    assert headers["attempts"] == 1  # permanent: not retried
    assert "127.0.0.1" in headers["last_error"]
    assert site.log == []


def test_a_blocked_site_is_dead_lettered_as_fetch_blocked_with_robots_enabled(
        settings, redis_client, amqp_channel, site):
    # robots.txt is fetched first and is refused by the guard as well; the page on the same
    # origin can never be fetched, so retrying as "robots unavailable" only wastes attempts.
    assert settings.robots_enabled
    url = canonicalize(site.page_url(8))
    _seed(settings, redis_client, [url])
    _run_until_every_url_has_an_outcome(settings.with_overrides(fetch_allow_networks=()),
                                        redis_client, amqp_channel, 1)

    records, dead = _outcomes(redis_client, amqp_channel)
    assert records == {} and set(dead) == {url}
    assert site.log == []
    headers = dead[url]
    assert headers["failure"] == "fetch_blocked", headers
    assert headers["attempts"] == 1, headers
