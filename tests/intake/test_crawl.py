from __future__ import annotations

from collections import Counter

import pytest

from common.intake.producer import Producer
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, queue_depth, results


@pytest.fixture
def small_site():
    with TestSite("127.0.0.9", pages=25, links_per_page=3) as site:
        yield site


def _crawl(settings, redis_client, site, **overrides):
    crawl = settings.with_overrides(crawl_enabled=True, idle_exit_s=1.5, concurrency=4,
                                    **overrides)
    with Producer(crawl, redis_client) as producer:
        producer.submit([site.page_url(1)])
    with WorkerThread(crawl) as worker:
        assert worker.join(60) == 0
    return results(redis_client)


def _expected(site, max_depth):
    """Breadth-first over the site's own link graph (every page also links to the index)."""
    def neighbours(path):
        if path == "/":
            return [f"/page/{n}" for n in range(1, site.pages + 1)]
        return [f"/page/{m}" for m in site.links_of(int(path.rsplit("/", 1)[1]))] + ["/"]

    seen, frontier = {"/page/1"}, ["/page/1"]
    for _ in range(max_depth):
        frontier = [n for p in frontier for n in neighbours(p) if n not in seen]
        seen.update(frontier)
    return seen


def test_a_crawl_from_one_seed_reaches_the_pages_within_the_depth_limit_once_each(
        settings, redis_client, small_site, amqp_channel):
    records = _crawl(settings, redis_client, small_site, crawl_max_depth=1)
    fetched = Counter(r.path for r in small_site.log if r.path != "/robots.txt")
    assert set(fetched) == _expected(small_site, 1)
    assert max(fetched.values()) == 1
    assert len(records) == len(fetched)
    assert {r["depth"] for r in records} == {0, 1}
    assert queue_depth(amqp_channel, "url_queue_ttl") == 0


def test_a_deeper_crawl_reaches_every_page_of_the_site_exactly_once(settings, redis_client,
                                                                   small_site):
    records = _crawl(settings, redis_client, small_site, crawl_max_depth=3)
    fetched = Counter(r.path for r in small_site.log if r.path != "/robots.txt")
    assert set(fetched) == {"/"} | {f"/page/{n}" for n in range(1, 26)}
    assert max(fetched.values()) == 1
    assert Counter(r["url"] for r in records).most_common(1)[0][1] == 1


def test_links_to_other_hosts_are_not_followed_by_default(settings, redis_client, small_site):
    other = TestSite("127.0.0.10", pages=3)
    small_site.route("/page/1", lambda _r: (200, {"Content-Type": "text/html"},
                                            f'<a href="{other.page_url(1)}">x</a>'
                                            f'<a href="/page/2">y</a>'.encode()))
    with other:
        records = _crawl(settings, redis_client, small_site, crawl_max_depth=1)
        assert other.log == []
    assert sorted(r["url"] for r in records) == [small_site.page_url(1), small_site.page_url(2)]


def test_the_per_domain_page_budget_caps_what_the_crawl_enqueues(settings, redis_client,
                                                                small_site):
    records = _crawl(settings, redis_client, small_site, crawl_max_depth=3, crawl_max_pages=5)
    assert len(records) == 1 + 5  # the seed plus the budget


def test_links_the_sites_robots_txt_disallows_are_not_enqueued(settings, redis_client,
                                                              small_site, amqp_channel):
    small_site.route("/robots.txt", lambda _r: (200, {"Content-Type": "text/plain"},
                                                b"User-agent: *\nDisallow: /page/2\n"))
    small_site.route("/page/1", lambda _r: (200, {"Content-Type": "text/html"},
                                            b'<a href="/page/2">no</a><a href="/page/3">ok</a>'))
    records = _crawl(settings, redis_client, small_site, crawl_max_depth=1)
    assert sorted(r["url"] for r in records) == [small_site.page_url(1), small_site.page_url(3)]
    assert queue_depth(amqp_channel, "failed_urls") == 0  # never enqueued, so never refused
