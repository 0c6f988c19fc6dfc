"""Hostile handlers through the real fleet: two ``worker.py`` processes run a router (written
into tmp_path) whose handlers raise after yielding an item, loop forever, return garbage (a
set, an item that is not JSON, a 50 MiB string, an item holding one, follow requests to
``javascript:`` and to another host) or allocate past HANDLER_MAX_MEMORY_BYTES, beside
ordinary pages. Every URL gets exactly one result, each hostile page says what went wrong
under ``data_errors.handler``, the ordinary pages' items are exact, and the crawl ends. Then
one worker is killed (SIGKILL) while a handler runs, and no page is lost."""

from __future__ import annotations

import os
import signal
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from common.core.config import load_settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.store.keys import COUNTERS
from devtools.services import reset_state
from devtools.testsite import TestSite
from tests.helpers import TEST_ENV, output_of, results, wait_for
from tests.test_examples import crawl_until, two_workers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_MEMORY_BYTES = 512 * 1024 * 1024
HTML = {"Content-Type": "text/html; charset=utf-8"}
ORDINARY = 12

HANDLERS = '''
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from scrape_fleet import Router

router = Router()
MARKS = Path(os.environ["HOSTILE_MARKS"])


@router.default
def ordinary(page):
    yield {"title": page.css("h1::text").get(), "depth": page.depth}


@router.handler("raises", url=r"/hostile/raises$")
def raises(page):
    yield {"before": "the error"}
    raise ValueError("no price on " + urlsplit(page.url).path)


@router.handler("loops", url=r"/hostile/loops$")
def loops(page):
    while True:
        pass


@router.handler("a_set", url=r"/hostile/set$")
def a_set(page):
    return {1, 2, 3}


@router.handler("not_json", url=r"/hostile/not-json$")
def not_json(page):
    return {"when": object()}


@router.handler("huge_string", url=r"/hostile/huge-string$")
def huge_string(page):
    return "x" * (50 * 1024 * 1024)


@router.handler("huge_item", url=r"/hostile/huge-item$")
def huge_item(page):
    return {"blob": "x" * (50 * 1024 * 1024)}


@router.handler("bad_follows", url=r"/hostile/follows$")
def bad_follows(page):
    yield page.follow("javascript:alert(1)")
    yield page.follow(f"http://localhost:{urlsplit(page.url).port}/hostile/elsewhere")
    yield {"followed": "nothing"}


@router.handler("hog", url=r"/hostile/hog$")
def hog(page):
    hoard = bytearray(2 * int(os.environ["HANDLER_MAX_MEMORY_BYTES"]))
    return {"size": len(hoard)}


@router.handler("waits", url=r"/hostile/waits$")
def waits(page):
    """Says which worker runs it (its parent), then waits for the test's go-ahead."""
    (MARKS / f"running-{os.getpid()}").write_text(str(os.getppid()))
    deadline = time.monotonic() + 20
    while not (MARKS / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"waited": True}
'''

#: Hostile path -> (the handler that runs, its items, the start of data_errors.handler).
#: A stopped or crashed child answers nothing: no handler name, no items.
HOSTILE = {
    "/hostile/raises": ("raises", [{"before": "the error"}],
                        "ValueError: no price on /hostile/raises"),
    "/hostile/loops": (None, [], "timeout: over HANDLER_TIMEOUT_S (2 s); stopped"),
    "/hostile/set": ("a_set", [], "TypeError: handler gave a set: expected an item"),
    "/hostile/not-json": ("not_json", [], "TypeError: Type is not JSON serializable: object"),
    "/hostile/huge-string": ("huge_string", [], "TypeError: handler gave a str: expected"),
    # Refused before encoding: orjson reserves ~10x a string's size to encode it and
    # segfaults when RLIMIT_AS refuses, which would read as a crash, not as the item's fault.
    "/hostile/huge-item": ("huge_item", [], "ValueError: an item holds over 4194304 bytes"),
    "/hostile/hog": (None, [], (f"crashed: MemoryError over HANDLER_MAX_MEMORY_BYTES "
                                f"({MAX_MEMORY_BYTES})")),
}


def _handlers_env(directory: Path) -> dict[str, str]:
    """The hostile router as an importable module in ``directory``, and what its workers need
    to find it."""
    (directory / "hostile_handlers.py").write_text(textwrap.dedent(HANDLERS))
    marks = directory / "marks"
    marks.mkdir()
    return {"PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]),
            "HOSTILE_MARKS": str(marks), "HANDLER_TIMEOUT_S": "2",
            "HANDLER_MAX_MEMORY_BYTES": str(MAX_MEMORY_BYTES)}


@pytest.fixture
def handlers_env(tmp_path: Path) -> dict[str, str]:
    return _handlers_env(tmp_path)


def _site() -> TestSite:
    site = TestSite(pages=ORDINARY, links_per_page=3)
    page = b"<html><body><h1>Hostile</h1><p>a page for a hostile handler</p></body></html>"
    for path in [*HOSTILE, "/hostile/follows", "/hostile/waits", "/hostile/elsewhere"]:
        site.route(path, lambda _r: (200, HTML, page))
    return site


def _ordinary_urls(site: TestSite) -> set[str]:
    return {canonicalize(site.page_url(n)) for n in range(1, ORDINARY + 1)}


@dataclass
class Crawl:
    """The one hostile crawl this module's tests read: records by URL, by path."""

    site: TestSite
    records: dict[str, dict[str, Any]]
    counters: dict[str, int]

    def at(self, path: str) -> dict[str, Any]:
        return self.records[canonicalize(self.site.url(path))]


@pytest.fixture(scope="module")
def crawl(services, tmp_path_factory) -> Crawl:
    """Hostile and ordinary pages crawled once by two workers (every URL exactly one
    result, nothing left queued: :func:`crawl_until` checks)."""
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    settings = load_settings({"RABBITMQ_URL": services.rabbitmq_url,
                              "REDIS_URL": services.redis_url, **TEST_ENV})
    env = _handlers_env(tmp_path_factory.mktemp("hostile"))
    client = redis.Redis.from_url(settings.redis_url)
    try:
        with _site() as site, two_workers(settings, "hostile_handlers:router", env) as procs:
            ordinary = sorted(_ordinary_urls(site))
            hostile = [canonicalize(site.url(p)) for p in [*HOSTILE, "/hostile/follows"]]
            urls = [*ordinary[:6], *hostile, *ordinary[6:]]
            with Producer(settings, client) as producer:
                assert producer.submit(urls).new == len(urls)
            records = crawl_until(settings, client, procs, set(urls))
            counters = {k.decode(): int(v) for k, v in client.hgetall(COUNTERS).items()}
        return Crawl(site, records, counters)
    finally:
        client.close()


def test_ordinary_pages_beside_hostile_handlers_keep_their_exact_items(crawl):
    for n in range(1, ORDINARY + 1):
        record = crawl.at(f"/page/{n}")
        assert record["handler"] == "default" and "data_errors" not in record
        assert record["items"] == [{"title": f"Page {n}", "depth": 0}]
        assert "handler_followed" not in record  # the ordinary handler follows nothing


def test_a_handler_that_raises_keeps_what_it_yielded_and_records_the_error(crawl):
    record = crawl.at("/hostile/raises")
    assert record["status"] == 200 and record["handler"] == "raises"
    assert record["items"] == [{"before": "the error"}]
    assert record["data_errors"] == {"handler": "ValueError: no price on /hostile/raises"}


def test_a_handler_that_loops_is_stopped_at_the_time_limit(crawl):
    record = crawl.at("/hostile/loops")
    assert (record["handler"], record["items"]) == (None, [])  # a killed child says nothing
    assert record["data_errors"] == {
        "handler": "timeout: over HANDLER_TIMEOUT_S (2 s); stopped"}
    assert crawl.counters.get("extractor_timeouts") == 1, crawl.counters


@pytest.mark.parametrize("path", ["/hostile/set", "/hostile/not-json", "/hostile/huge-string",
                                  "/hostile/huge-item"])
def test_garbage_from_a_handler_is_recorded_with_what_was_wrong(crawl, path):
    handler, items, error = HOSTILE[path]
    record = crawl.at(path)
    assert record["status"] == 200
    assert (record["handler"], record["items"]) == (handler, items), record.get("data_errors")
    assert record["data_errors"]["handler"].startswith(error), record["data_errors"]


def test_follow_requests_to_javascript_or_another_host_are_dropped_unfetched(crawl):
    record = crawl.at("/hostile/follows")
    assert record["handler"] == "bad_follows" and record["items"] == [{"followed": "nothing"}]
    assert record["handler_followed"] == 0 and "data_errors" not in record
    assert not [r for r in crawl.site.log if r.host.startswith("localhost")]


def test_a_handler_past_the_memory_limit_crashes_its_child_not_the_worker(crawl):
    record = crawl.at("/hostile/hog")
    assert record["data_errors"] == {"handler": (
        f"crashed: MemoryError over HANDLER_MAX_MEMORY_BYTES ({MAX_MEMORY_BYTES})")}
    assert (record["handler"], record["items"]) == (None, [])
    assert crawl.counters.get("extractor_crashes") == 1, crawl.counters  # this page alone


def test_a_worker_killed_while_a_handler_runs_loses_no_page(settings, redis_client,
                                                            handlers_env):
    marks = Path(handlers_env["HOSTILE_MARKS"])
    env = {**handlers_env, "HANDLER_TIMEOUT_S": "30"}
    with _site() as site, two_workers(settings, "hostile_handlers:router", env) as procs:
        waits = canonicalize(site.url("/hostile/waits"))
        urls = [*sorted(_ordinary_urls(site)), waits]
        with Producer(settings, redis_client) as producer:
            assert producer.submit(urls).new == len(urls)
        assert wait_for(lambda: any(marks.glob("running-*")), 30), \
            [output_of(p)[-2000:] for p in procs]
        [mark] = marks.glob("running-*")
        pids = {p.pid: p for p in procs}
        victim = pids[int(mark.read_text())]  # the worker whose child runs the handler
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        (marks / "go").touch()
        survivor = next(p for p in procs if p is not victim)
        done = wait_for(lambda: set(urls) <= {r["url"] for r in results(redis_client)}, 60,
                        step_s=0.1)
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(60) == 0, output_of(survivor)[-3000:]
    assert done, output_of(survivor)[-3000:]
    per_url = Counter(r["url"] for r in results(redis_client))
    assert per_url == Counter(urls), per_url  # each page once: none lost, none twice
    record = next(r for r in results(redis_client) if r["url"] == waits)
    assert record["items"] == [{"waited": True}] and record["handler"] == "waits"
    assert len(list(marks.glob("running-*"))) == 2  # the handler ran again, in the survivor
