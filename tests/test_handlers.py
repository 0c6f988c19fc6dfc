"""HANDLERS through a real worker (RabbitMQ, Redis, the loopback site): the handler a page
runs follows the label its request gave, ``meta`` and request headers travel with the
follow requests, items land in the record, and a failing handler is recorded on its page."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from common.core.errors import ConfigError
from common.intake.producer import Producer
from common.work.page_record import PageReader
from tests.helpers import WorkerThread, results

pytestmark = pytest.mark.integration

HTML = {"Content-Type": "text/html; charset=utf-8"}

ROUTER = '''
from scrape_fleet import DropItem, Router

router = Router()

@router.default
def listing(page):
    yield page.follow(page.css("a.p::attr(href)").getall(), "product",
                      meta={"list": page.url}, headers={"X-From-List": "yes"})
    yield page.follow(page.css("a.off::attr(href)").getall())   # another host: out of scope
    yield {"kind": "listing", "products": len(page.css("a.p"))}

@router.handler("product")
def product(page):
    if page.css(".boom"):
        yield {"kind": "partial"}
        raise ValueError("bad product page")
    yield {"kind": "product", "name": page.css("h1::text").get(), "from": page.meta["list"],
           "price": page.css(".price::text").get(), "depth": page.depth}

@router.item
def priced(item, page):
    if item["kind"] == "product" and not item["price"]:
        raise DropItem("no price")
    return item
'''


@pytest.fixture
def router_module(tmp_path, monkeypatch) -> str:
    name = f"handlers_{uuid.uuid4().hex}"  # a fresh module: sys.modules caches by name
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(ROUTER))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _product(name: str, price: str | None, boom: bool = False) -> bytes:
    price_html = f"<p class=price>{price}</p>" if price else ""
    return (f"<html><body><h1>{name}</h1>{price_html}{'<p class=boom>' if boom else ''}"
            "</body></html>").encode()


def test_labels_meta_and_headers_travel_with_follow_requests_and_items_are_recorded(
        settings, redis_client, site, router_module):
    seen_headers: dict[str, str | None] = {}

    def product(path: str, name: str, price: str | None, boom: bool = False):
        def respond(request):
            seen_headers[path] = request.headers.get("X-From-List")
            return 200, HTML, _product(name, price, boom)
        site.route(path, respond)

    site.route("/list", lambda _r: (200, HTML, (
        b'<a class=p href="/p/1">1</a><a class=p href="/p/2">2</a><a class=p href="/p/3">3</a>'
        b'<a class=off href="http://elsewhere.invalid/x">x</a>')))
    product("/p/1", "Kettle", "12.50")
    product("/p/2", "Spoon", None)
    product("/p/3", "Broken", "1.00", boom=True)
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url("/list")])
    worker_settings = settings.with_overrides(handlers=f"{router_module}:router",
                                              idle_exit_s=1.0, concurrency=4)
    with WorkerThread(worker_settings) as worker:
        assert worker.join(30) == 0
    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == {site.url(p) for p in ("/list", "/p/1", "/p/2", "/p/3")}
    listing = records[site.url("/list")]
    assert listing["handler"] == "default" and listing["handler_followed"] == 3
    assert listing["items"] == [{"kind": "listing", "products": 3}]
    assert records[site.url("/p/1")]["items"] == [{
        "kind": "product", "name": "Kettle", "from": site.url("/list"), "price": "12.50",
        "depth": 1}]
    spoon = records[site.url("/p/2")]
    assert spoon["handler"] == "product" and spoon["items"] == []
    assert spoon["dropped"] == [{"reason": "no price", "by": "priced"}]
    broken = records[site.url("/p/3")]
    assert broken["items"] == [{"kind": "partial"}]
    assert broken["data_errors"] == {"handler": "ValueError: bad product page"}
    assert seen_headers == {"/p/1": "yes", "/p/2": "yes", "/p/3": "yes"}


def test_handlers_and_extractor_together_or_a_non_router_are_refused_at_start(
        settings, router_module):
    with pytest.raises(ConfigError, match="HANDLERS and EXTRACTOR are both set"):
        PageReader(settings.with_overrides(handlers=f"{router_module}:router",
                                           extractor=f"{router_module}:listing"))
    with pytest.raises(ConfigError, match="is a function, not a scrape_fleet.Router"):
        PageReader(settings.with_overrides(handlers=f"{router_module}:listing"))
    with pytest.raises(ConfigError, match="cannot import module"):
        PageReader(settings.with_overrides(handlers="no_such_module_here:router"))


SLOW_ROUTER = '''
import os, time
from scrape_fleet import Router

router = Router()

@router.default
def slow(page):
    started = time.time()
    time.sleep(0.4)
    return {"pid": os.getpid(), "started": started, "ended": time.time()}
'''


def test_pages_of_one_fetch_loop_run_their_handlers_at_once_in_several_children(
        settings, redis_client, site, tmp_path, monkeypatch):
    name = f"slow_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SLOW_ROUTER))
    monkeypatch.syspath_prepend(str(tmp_path))
    paths = [f"/overlap/{n}" for n in range(4)]
    for path in paths:
        site.route(path, lambda _r: (200, HTML, b"<html><body><p>slow</p></body></html>"))
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url(p) for p in paths])
    worker_settings = settings.with_overrides(handlers=f"{name}:router", fetch_loops=1,
                                              concurrency=4, handler_processes=2,
                                              idle_exit_s=1.0)
    with WorkerThread(worker_settings) as worker:
        assert worker.join(30) == 0
    items = [r["items"][0] for r in results(redis_client)]
    assert len(items) == 4 and len({item["pid"] for item in items}) == 2
    spans = sorted((item["started"], item["ended"]) for item in items)
    # A page waiting for its child let the loop's other pages start theirs: calls overlap.
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


INLINE_ROUTER = '''
import threading
from scrape_fleet import Router

router = Router()

@router.default
def page(page):
    if page.url.endswith("/loops"):
        while True:
            pass
    if page.url.endswith("/swallows"):
        try:
            while True:
                pass
        except Exception:  # a handler's own catch-all does not keep it running
            return {"swallowed": True}
    return {"h1": page.css("h1::text").get(), "thread": threading.current_thread().name}
'''


def test_inline_handlers_run_in_the_worker_and_a_python_loop_is_stopped_on_time(
        settings, redis_client, site, tmp_path, monkeypatch):
    name = f"inline_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(INLINE_ROUTER))
    monkeypatch.syspath_prepend(str(tmp_path))
    paths = ["/in/loops", "/in/swallows", *(f"/in/ok{n}" for n in range(6))]
    for path in paths:
        site.route(path, lambda _r: (200, HTML, b"<html><body><h1>Kettle</h1></body></html>"))
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url(p) for p in paths])
    worker_settings = settings.with_overrides(handlers=f"{name}:router",
                                              handler_isolation="inline",
                                              handler_timeout_s=0.5, idle_exit_s=1.0)
    with WorkerThread(worker_settings) as worker:
        assert worker.join(30) == 0
    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == {site.url(p) for p in paths}
    for path in ("/in/loops", "/in/swallows"):
        assert records[site.url(path)]["data_errors"] == {
            "handler": "timeout: over HANDLER_TIMEOUT_S (0.5 s); stopped"}
    for n in range(6):
        record = records[site.url(f"/in/ok{n}")]
        assert record["items"][0]["h1"] == "Kettle" and "data_errors" not in record
        assert record["items"][0]["thread"].startswith("fetch")  # the worker's own thread


def test_in_crawl_mode_a_link_a_handler_follows_keeps_its_label_and_meta(
        settings, redis_client, site, router_module):
    site.route("/list", lambda _r: (200, HTML, b'<a class=p href="/p/1">1</a>'))
    site.route("/p/1", lambda _r: (200, HTML, _product("Kettle", "12.50")))
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url("/list")])
    worker_settings = settings.with_overrides(handlers=f"{router_module}:router",
                                              crawl_enabled=True, idle_exit_s=1.0)
    with WorkerThread(worker_settings) as worker:
        assert worker.join(30) == 0
    records = {r["url"]: r for r in results(redis_client)}
    assert records[site.url("/p/1")]["handler"] == "product"
    assert records[site.url("/p/1")]["items"][0]["from"] == site.url("/list")
    assert records[site.url("/list")]["handler_followed"] == 1
