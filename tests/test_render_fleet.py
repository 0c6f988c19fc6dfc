"""Rendering through the whole fleet (issue 29): real RabbitMQ and Redis, ``worker.py``
processes (HTTP workers and ``--render`` workers driving Debian's Chromium), loopback sites
whose content is written by JavaScript (devtools/js_site.py), judged by the sites' request
logs, the workers' logs, the results and the WARC files.

One crawl (``js_crawl``) is read by several tests: pages written by script, an XHR listing,
an infinite scroll capped by its rule, a redirect made by script, a page trying private-range
and link-local addresses, plain pages, archived as WARC. The others each run their own:
RENDER=auto, a ``when_missing`` rule, a handler's ``page.follow(url, render=True)``, the rate
limit with sub-requests, a cookie wall.

A request the site saw came from Chromium when it carries ``Sec-Fetch-Dest`` (the HTTP path
sends no such header).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from warcio.archiveiterator import ArchiveIterator

from common.broker import topology
from common.core.config import load_settings
from common.intake.producer import Producer
from common.store.keys import RENDER_DOMAINS
from devtools.js_site import (
    BATCH,
    BURST_PARTS,
    ITEMS,
    LEAKY_IMAGE,
    LEAKY_TARGETS,
    install_js_pages,
    product_shell,
)
from devtools.services import reset_state
from devtools.testsite import RequestRecord, TestSite, start_sites
from tests.helpers import (
    TEST_ENV,
    drain,
    output_of,
    own_channel,
    results,
    start_worker_process,
    wait_for,
)
from tests.test_render_faults import process_tree, still_running

pytestmark = pytest.mark.slow

FIELDS = {"name": ".name", "price": {"css": ".price", "type": "float"}}


def _html(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/html; charset=utf-8"}, body.encode()


def _scripted(title: str) -> str:
    """A JavaScript shell: the heading and the product are written by its script."""
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body><div id=app></div>"
            "<script>document.getElementById('app').innerHTML = "
            f"'<h1 class=name>{title}</h1><span class=price>9.99</span>';</script></body></html>")


def _plain(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body><h1 class=name>"
            f"{title}</h1><span class=price>1.00</span><p>{'plain text ' * 40}</p></body></html>")


def _by_browser(record: RequestRecord) -> bool:
    return any(name.lower() == "sec-fetch-dest" for name in record.headers)


def _rules(tmp_path: Path, rules: list[dict[str, Any]]) -> str:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": rules}))
    return f"@{path}"


def _seed(settings, client: redis.Redis, urls: list[str]) -> None:
    with Producer(settings, client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _one_each(client: redis.Redis) -> dict[str, dict]:
    found = results(client)
    counts = Counter(r["url"] for r in found)
    assert all(c == 1 for c in counts.values()), counts.most_common(3)
    return {r["url"]: r for r in found}


def _failures(client: redis.Redis) -> list[dict]:
    return [json.loads(f[b"json"]) for _id, f in client.xrange("failures")]


def _http(settings, env: dict[str, str], worker_id: str = "http"):
    return start_worker_process(settings, env={**env, "WORKER_ID": worker_id})


def _render(settings, env: dict[str, str], worker_id: str = "render", *args: str):
    return start_worker_process(settings, "--render", *args,
                                env={**env, "WORKER_ID": worker_id})


@contextmanager
def _fleet(*procs: subprocess.Popen) -> Iterator[list[subprocess.Popen]]:
    """Worker processes, killed on the way out if the test left any running."""
    try:
        yield list(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _finish(client: redis.Redis, procs: list[subprocess.Popen], urls: set[str],
            timeout_s: float = 120) -> None:
    """Wait until each of ``urls`` has an outcome (a result or a failure), then stop the
    workers (SIGTERM: they finish what they hold) and check each exited 0. Waiting for the
    outcomes, not for an idle exit: an HTTP worker idle while a page renders is still needed
    for the links the rendered page gives."""
    def outcomes() -> set[str]:
        return {r["url"] for r in results(client)} | {f["url"] for f in _failures(client)}

    done = wait_for(lambda: urls <= outcomes(), timeout_s, step_s=0.2)
    time.sleep(0.5)  # a duplicate or an unexpected page would show up meanwhile
    below = {pid: started for proc in procs for pid, started in process_tree(proc.pid).items()}
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, output_of(proc)[-3000:]
    # No Chromium (nor driver) outlives its worker: orphans would have left our tree.
    assert wait_for(lambda: not still_running(below), 15, step_s=0.2), still_running(below)
    missing = sorted(urls - outcomes())
    assert done and not missing, (missing, [output_of(p)[-2000:] for p in procs])


def _consumers(settings, queue: str, count: int) -> bool:
    with own_channel(settings) as channel:
        return wait_for(lambda: channel.queue_declare(
            queue=queue, passive=True).method.consumer_count >= count, 60)


# -- one crawl of the JavaScript site, read by the tests below ----------------------------------

PRODUCTS = [f"/js/product/{n}" for n in range(4)]
PLAIN = [f"/plain/{n}" for n in range(4)]
SCROLLS = 3


@dataclass
class JsCrawl:
    site: TestSite
    records: dict[str, dict]
    failures: list[dict]
    http_log: str
    render_log: str
    archive_dir: Path
    dead: list  # what the failed queue held

    def at(self, path: str) -> dict:
        return self.records[self.site.url(path)]


@pytest.fixture(scope="module")
def js_crawl(services, tmp_path_factory) -> Iterator[JsCrawl]:
    """Products, a listing, an infinite scroll, a redirect, a leaky page and plain pages,
    crawled once by an HTTP worker and a render worker, archived as WARC."""
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    settings = load_settings({"RABBITMQ_URL": services.rabbitmq_url,
                              "REDIS_URL": services.redis_url, **TEST_ENV})
    tmp = tmp_path_factory.mktemp("js_crawl")
    rules = _rules(tmp, [
        {"name": "scroll", "path": "^/js/scroll$",
         "render": {"scroll": SCROLLS, "wait_for": "li.item"},
         "fields": {"items": {"css": "li.item", "many": True}}},
        {"name": "listing", "path": "^/js/listing$", "render": {"wait_for": "li.item"},
         "fields": {"name": ".name", "items": {"css": "li.item", "many": True}}},
        {"name": "leaky", "path": "^/js/leaky$", "render": {"wait_for": "p.done"},
         "fields": {"name": ".name", "done": "p.done"}},
        {"name": "redirect", "path": "^/js/redirect$", "render": {"wait_for": ".name"},
         "fields": FIELDS},
        {"name": "js", "path": "^/js/", "render": True, "fields": FIELDS},
        {"name": "plain", "path": "^/plain/", "fields": FIELDS}])
    archive_dir = tmp / "archive"
    # Images go to the address guard rather than being refused by type.
    env = {"EXTRACT_RULES": rules, "ROBOTS_ENABLED": "false", "ARCHIVE": "warc",
           "ARCHIVE_DIR": str(archive_dir), "RENDER_BLOCK_TYPES": "font,media"}
    client = redis.Redis.from_url(settings.redis_url)
    site = TestSite().start()
    try:
        install_js_pages(site)
        paths = [*PRODUCTS, "/js/listing", "/js/scroll", "/js/redirect", "/js/leaky", *PLAIN]
        _seed(settings, client, [site.url(p) for p in paths])
        with _fleet(_http(settings, env), _render(settings, env)) as procs:
            _finish(client, procs, {site.url(p) for p in paths})
        with own_channel(settings) as channel:
            dead = drain(channel, topology.FAILED_QUEUE)
        yield JsCrawl(site, _one_each(client), _failures(client), output_of(procs[0]),
                      output_of(procs[1]), archive_dir, dead)
    finally:
        client.close()
        site.stop()


def test_pages_written_by_script_and_an_xhr_listing_are_extracted_from_the_rendered_dom(
        js_crawl):
    for n, path in enumerate(PRODUCTS):
        record = js_crawl.at(path)
        assert (record["worker"], record.get("rendered")) == ("render", True), record
        assert record["data"] == {"name": f"product {n}", "price": n + 0.5}
    listing = js_crawl.at("/js/listing")
    assert (listing["worker"], listing.get("rendered")) == ("render", True)
    assert listing["data"] == {"name": "listing", "items": list(ITEMS)}
    assert js_crawl.failures == [] and js_crawl.dead == []
    fetched = Counter(r.path for r in js_crawl.site.log)
    assert all(fetched[p] == 1 for p in [*PRODUCTS, "/js/listing", *PLAIN]), fetched
    # The listing's XHR went to the site once, from the browser.
    xhr = js_crawl.site.requests_for("/api/items")
    assert len(xhr) == 1 and _by_browser(xhr[0])


def test_plain_pages_never_touch_a_browser(js_crawl):
    for n, path in enumerate(PLAIN):
        record = js_crawl.at(path)
        assert (record["worker"], record.get("rendered")) == ("http", None), record
        assert record["data"] == {"name": f"plain {n}", "price": n + 0.25}
    plain = js_crawl.site.requests_for("/plain/")
    assert sorted(r.path for r in plain) == PLAIN
    assert not any(_by_browser(r) for r in plain)
    assert "/plain/" not in js_crawl.render_log
    scripted = js_crawl.site.requests_for("/js/")
    assert scripted and all(_by_browser(r) for r in scripted)  # never fetched over HTTP


def test_an_infinite_scroll_capped_by_its_rule_gives_the_first_batch_and_three_more(js_crawl):
    record = js_crawl.at("/js/scroll")
    assert record.get("rendered") is True
    assert record["data"]["items"] == [f"item {i}" for i in range(BATCH * (1 + SCROLLS))]


def test_a_redirect_made_by_script_is_recorded_at_its_target_with_the_targets_data(js_crawl):
    record = js_crawl.at("/js/redirect")
    assert record["final_url"] == js_crawl.site.url("/js/target")
    assert record["data"] == {"name": "target", "price": 7.0}
    assert js_crawl.site.count("/js/target") == 1


def test_private_and_link_local_requests_are_refused_and_logged_while_the_page_renders(
        js_crawl):
    record = js_crawl.at("/js/leaky")
    assert record["status"] == 200 and record.get("rendered") is True
    # Every XHR ended (refused) before the data were read.
    assert record["data"] == {"name": "leaky", "done": "tried"}
    page = js_crawl.site.url("/js/leaky")
    lines = [line for line in js_crawl.render_log.splitlines()
             if page in line and "refused" in line]
    assert lines, js_crawl.render_log[-3000:]
    said = "\n".join(lines)
    for target in [*LEAKY_TARGETS, LEAKY_IMAGE]:  # each refused by the address guard
        assert re.search(re.escape(target) + r" \([^)]*address guard", said), said


def test_the_warc_response_of_a_rendered_page_holds_the_rendered_dom(js_crawl):
    record = js_crawl.at("/js/product/2")
    assert "archive" in record, f"a rendered page was not archived: {record}"
    ref = record["archive"]
    with open(js_crawl.archive_dir / ref["file"], "rb") as stream:
        stream.seek(ref["offset"])
        archived = next(iter(ArchiveIterator(stream)))
        assert archived.rec_type == "response"
        assert archived.rec_headers.get_header("WARC-Target-URI") == record["final_url"]
        payload = archived.content_stream().read().decode()
    assert '<h1 class="name">product 2</h1>' in payload  # written by the page's script
    assert '<h1 class="name">' not in product_shell(2)  # what the site sends has none


# -- crawls of their own --------------------------------------------------------------------


def test_with_render_auto_a_shell_marks_its_domain_and_later_pages_go_straight_to_a_browser(
        settings, redis_client, own_sites, tmp_path):
    """The hub, a shell, is read plainly once and rendered; the links its script wrote are
    crawled, and the pages seeded once its domain was marked are rendered without a plain
    fetch."""
    [site] = start_sites(1, first_host="127.0.0.2")
    own_sites.append(site)
    install_js_pages(site, products=6)
    site.route("/js/hub", lambda _r: _html(
        "<html><body><div id=app></div><script>document.getElementById('app').innerHTML ="
        " '<a href=/js/product/4>4</a> <a href=/js/product/5>5</a>';</script></body></html>"))
    seeded, crawled = PRODUCTS[1:], ["/js/product/4", "/js/product/5"]
    env = {"EXTRACT_RULES": _rules(tmp_path, [{"path": "^/js/", "fields": FIELDS}]),
           "ROBOTS_ENABLED": "false", "RENDER": "auto", "CRAWL_ENABLED": "true",
           "CRAWL_MAX_DEPTH": "1"}
    with _fleet(_http(settings, env), _render(settings, env)) as procs:
        _seed(settings, redis_client, [site.url("/js/hub")])
        assert wait_for(lambda: redis_client.hlen(RENDER_DOMAINS) == 1, 60), \
            output_of(procs[0])[-3000:]
        _seed(settings, redis_client, [site.url(p) for p in seeded])
        _finish(redis_client, procs, {site.url(p) for p in ["/js/hub", *seeded, *crawled]})

    assert list(redis_client.hkeys(RENDER_DOMAINS)) == [b"default|127.0.0.2"]
    found = _one_each(redis_client)
    assert set(found) == {site.url(p) for p in ["/js/hub", *seeded, *crawled]}
    assert (found[site.url("/js/hub")]["worker"], found[site.url("/js/hub")].get("rendered")) \
        == ("render", True)
    for path in [*seeded, *crawled]:
        record = found[site.url(path)]
        assert (record["worker"], record.get("rendered")) == ("render", True), record
        n = int(path.rsplit("/", 1)[1])
        assert record["data"] == {"name": f"product {n}", "price": n + 0.5}
    hub = site.requests_for("/js/hub")
    assert [_by_browser(r) for r in hub] == [False, True]  # read plainly, then rendered
    for path in [*seeded, *crawled]:
        later = site.requests_for(path)
        assert [_by_browser(r) for r in later] == [True], path  # no plain fetch any more


def test_a_when_missing_rule_renders_only_the_pages_lacking_its_selector(
        settings, redis_client, own_sites, tmp_path):
    with_product, without = start_sites(2, first_host="127.0.0.3")
    own_sites.extend([with_product, without])
    pages = [f"/shop/{n}" for n in range(3)]
    for n, path in enumerate(pages):
        with_product.route(path, lambda _r, n=n: _html(
            f"<html><body><div class=product>plain {n}</div><script>var x = 1;</script>"
            "</body></html>"))
        without.route(path, lambda _r, n=n: _html(
            "<html><body><div id=app></div><script>document.getElementById('app').innerHTML"
            f" = '<div class=product>scripted {n}</div>';</script></body></html>"))
    env = {"EXTRACT_RULES": _rules(tmp_path, [
        {"path": "^/shop/", "render": {"when_missing": ".product"},
         "fields": {"product": ".product"}}]), "ROBOTS_ENABLED": "false"}
    urls = [s.url(p) for p in pages for s in (with_product, without)]
    _seed(settings, redis_client, urls)
    with _fleet(_http(settings, env), _render(settings, env)) as procs:
        _finish(redis_client, procs, set(urls))

    found = _one_each(redis_client)
    assert len(found) == 2 * len(pages)
    for n, path in enumerate(pages):
        kept = found[with_product.url(path)]
        assert (kept["worker"], kept.get("rendered"), kept["data"]) == (
            "http", None, {"product": f"plain {n}"})
        rendered = found[without.url(path)]
        assert (rendered["worker"], rendered.get("rendered"), rendered["data"]) == (
            "render", True, {"product": f"scripted {n}"})
        assert [_by_browser(r) for r in without.requests_for(path)].count(True) == 1
    assert not any(_by_browser(r) for r in with_product.log)
    assert list(redis_client.hkeys(RENDER_DOMAINS)) == [b"default|127.0.0.4"]


ROUTER = '''
from scrape_fleet import Router

router = Router()


@router.default
def start(page):
    yield page.follow("/js/product/1", "product", render=True)
    yield page.follow("/js/product/2", "product")
    yield {"start": page.css("h1::text").get()}


@router.handler("product")
def product(page):
    yield {"name": page.css(".name::text").get()}
'''


def test_a_handler_following_with_render_true_gets_its_page_rendered(
        settings, redis_client, own_sites, tmp_path):
    [site] = start_sites(1, first_host="127.0.0.5")
    own_sites.append(site)
    install_js_pages(site)
    (tmp_path / "render_handlers.py").write_text(textwrap.dedent(ROUTER))
    env = {"HANDLERS": "render_handlers:router", "PYTHONPATH": str(tmp_path),
           "ROBOTS_ENABLED": "false"}
    _seed(settings, redis_client, [site.url("/plain/0")])
    with _fleet(_http(settings, env), _render(settings, env)) as procs:
        _finish(redis_client, procs, {site.url(p) for p in
                                      ("/plain/0", "/js/product/1", "/js/product/2")})

    found = _one_each(redis_client)
    assert found[site.url("/plain/0")]["items"] == [{"start": "plain 0"}]
    followed = found[site.url("/js/product/1")]
    assert (followed["worker"], followed.get("rendered"), followed["handler"]) == (
        "render", True, "product")
    assert followed["items"] == [{"name": "product 1"}]
    unrendered = found[site.url("/js/product/2")]  # not asked: the script never ran
    assert (unrendered["worker"], unrendered.get("rendered")) == ("http", None)
    assert unrendered["items"] == [{"name": None}]
    assert [_by_browser(r) for r in site.requests_for("/js/product/1")] == [True]


#: The burst pages' site allows RATE requests in any WINDOW_S seconds.
RATE, WINDOW_S = 3, 8


def test_sub_requests_of_rendered_pages_count_against_the_sites_rate_limit(
        settings, redis_client, own_sites, tmp_path):
    """Each page asks the site for BURST_PARTS scripts besides its document, more than RATE.
    Its permit is taken before it loads and its scripts are charged after it rendered, all
    at once: the site's rate log is then over RATE until a whole window has gone by since the
    charge, so the second page's document comes at least WINDOW_S after the first page's last
    script, and no window holds more than RATE + BURST_PARTS requests (the charged ones, and
    the scripts of a page not charged yet). Without the charge the second document would be
    let through at once (one permit used of RATE): both pages' 14 requests in a few seconds.
    A long window keeps this clear of how slow a loaded machine renders."""
    [site] = start_sites(1, first_host="127.0.0.6")
    own_sites.append(site)
    install_js_pages(site)
    pages = [f"/js/burst/{n}" for n in range(2)]
    env = {"EXTRACT_RULES": _rules(tmp_path, [
        {"path": "^/js/burst/", "render": {"wait_for": ".count"},
         "fields": {"name": ".name", "count": {"css": ".count", "type": "int"}}}]),
        "ROBOTS_ENABLED": "false", "RATE_LIMIT": f"{RATE}/{WINDOW_S} seconds",
        "RENDER_THREADS": "1"}
    _seed(settings, redis_client, [site.url(p) for p in pages])
    with _fleet(_http(settings, env), _render(settings, env, "render", "--concurrency",
                                              "1")) as procs:
        _finish(redis_client, procs, {site.url(p) for p in pages})

    found = _one_each(redis_client)
    assert [found[site.url(p)]["data"] for p in pages] == [
        {"name": "burst", "count": BURST_PARTS}] * len(pages)
    log = sorted(site.log, key=lambda r: r.monotonic_s)
    assert len(log) == len(pages) * (1 + BURST_PARTS)
    arrivals = [r.monotonic_s for r in log]
    busiest = max(sum(1 for t in arrivals[i:] if t < start + WINDOW_S)
                  for i, start in enumerate(arrivals))
    assert busiest <= RATE + BURST_PARTS, busiest
    documents = [i for i, r in enumerate(log) if r.path.startswith("/js/burst/")]
    assert documents == [0, 1 + BURST_PARTS], [r.path for r in log]
    gap_s = arrivals[documents[1]] - arrivals[documents[1] - 1]
    assert gap_s >= WINDOW_S - 0.1, gap_s  # less 0.1 s: the site's clock is not Redis's


SECRET = "r3nd3r-w4ll-91c"


def test_a_cookie_wall_is_passed_by_render_workers_sharing_the_session(
        settings, redis_client, own_sites, tmp_path):
    """The entrance, rendered by one render worker, sets the wall's cookie; the walled pages,
    written by script, are rendered by both render workers with it: the session's jar is
    the fleet's (Redis), not a browser's (each page has a fresh context)."""
    [site] = start_sites(1, first_host="127.0.0.7")
    own_sites.append(site)
    walled = [f"/wall/{n}" for n in range(1, 7)]

    def entrance(_r: RequestRecord):
        status, headers, body = _html(_plain("entrance"))
        return status, {**headers, "Set-Cookie": f"wall={SECRET}; Path=/; HttpOnly"}, body

    def wall(record: RequestRecord, n: int):
        if f"wall={SECRET}" not in record.headers.get("Cookie", ""):
            return 403, {"Content-Type": "text/html"}, b"<html><body>no cookie</body></html>"
        return _html(_scripted(f"walled {n}"))

    site.route("/wall/0", entrance)
    for n, path in enumerate(walled, start=1):
        site.route(path, lambda r, n=n: wall(r, n))
    env = {"EXTRACT_RULES": _rules(tmp_path, [
        {"path": "^/wall/", "render": True, "fields": FIELDS}]), "ROBOTS_ENABLED": "false"}
    with _fleet(_http(settings, env), _render(settings, env, "render-0"),
                _render(settings, env, "render-1")) as procs:
        _seed(settings, redis_client, [site.url("/wall/0")])
        assert wait_for(lambda: len(results(redis_client)) == 1, 60)
        assert _consumers(settings, topology.RENDER_QUEUE, 2)
        _seed(settings, redis_client, [site.url(p) for p in walled])
        _finish(redis_client, procs, {site.url(p) for p in ["/wall/0", *walled]})

    found = _one_each(redis_client)
    assert found[site.url("/wall/0")].get("rendered") is True
    for n, path in enumerate(walled, start=1):
        record = found[site.url(path)]
        assert (record["status"], record.get("rendered")) == (200, True), record
        assert record["data"]["name"] == f"walled {n}"
    assert {found[site.url(p)]["worker"] for p in walled} == {"render-0", "render-1"}
    assert all(_by_browser(r) for r in site.log)  # the HTTP worker fetched nothing
    behind = site.requests_for("/wall/")[1:]
    assert len(behind) == len(walled)
    assert all(f"wall={SECRET}" in r.headers.get("Cookie", "") for r in behind)
    for proc in procs:
        assert SECRET not in output_of(proc)
