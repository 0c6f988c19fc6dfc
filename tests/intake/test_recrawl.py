from __future__ import annotations

from common.intake.producer import Producer
from common.store.keys import COUNTERS
from tests.helpers import WorkerThread, results


def _run(settings):
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0)) as worker:
        assert worker.join(30) == 0


def test_a_recrawl_within_the_cache_ttl_is_answered_from_the_cache(settings, redis_client,
                                                                  site):
    url = site.page_url(7)
    with Producer(settings, redis_client) as producer:
        assert producer.submit([url]).new == 1
    _run(settings)
    assert site.count("/page/7") == 1
    with Producer(settings, redis_client) as producer:
        assert producer.submit([url]).duplicate == 1  # plain re-seeding is deduplicated
        assert producer.submit([url], recrawl=True).new == 1  # a refresh goes through
    _run(settings)
    records = results(redis_client)
    assert [(r["url"], r["cached"]) for r in records] == [(url, False), (url, True)]
    assert records[1]["title"] == records[0]["title"] == "Page 7"
    assert site.count("/page/7") == 1  # the refresh sent no request
    assert redis_client.hget(COUNTERS, "cache_hits") == b"1"


def test_a_recrawl_after_the_cache_ttl_fetches_again(settings, redis_client, site, run_cli):
    url = site.page_url(8)
    no_cache = settings.with_overrides(cache_ttl_s=0)
    with Producer(no_cache, redis_client) as producer:
        producer.submit([url])
    _run(no_cache)
    again = run_cli("producer.py", "--recrawl", url)
    assert again.returncode == 0 and "new=1" in again.stdout
    _run(no_cache)
    assert [r["cached"] for r in results(redis_client)] == [False, False]
    assert site.count("/page/8") == 2
