"""A robots.txt that answers 429 or 503 blocks its whole domain fleet-wide, like any URL of the
domain would (common/work/robots_gate.py, common/web/throttle.py): real RabbitMQ and Redis,
a loopback site."""

from __future__ import annotations

import pytest

from common.broker.topology import HOLD_LEVELS_MS, hold_name
from common.intake.producer import Producer
from common.web.ratelimit import RateLimiter
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, queue_depth, results


@pytest.mark.parametrize("status, retry_after", [(503, "30"), (429, None)])
def test_a_robots_txt_answering_429_or_503_blocks_the_whole_domain(settings, redis_client,
                                                                    amqp_channel, own_sites,
                                                                    status, retry_after):
    site = TestSite().start()
    own_sites.append(site)
    headers = {"Retry-After": retry_after} if retry_after else {}
    site.route("/robots.txt", lambda _r: (status, headers, b"busy"))
    urls = [site.page_url(n) for n in range(1, 6)]
    with Producer(settings, redis_client) as producer:
        assert producer.submit(urls).new == len(urls)
    blocking = settings.with_overrides(idle_exit_s=1.0, max_retries=1, throttle_block_start_s=20,
                                       throttle_block_max_s=60)
    with WorkerThread(blocking) as worker:
        assert worker.join(60) == 0

    [row] = RateLimiter(redis_client, settings).throttled()
    assert row["domain"] == site.host and row["last_status"] == status
    assert row["blocked_s"] >= 15, row  # Retry-After 30, or the curve's first 20 s block
    assert f"http_{status}" in row["reason"]
    # Only robots.txt was ever asked: no page of the blocked domain, and no second robots.txt.
    assert [r.path for r in site.log] == ["/robots.txt"]
    assert results(redis_client) == []
    # Each URL was retried once and now waits for the block to end, when robots.txt is asked
    # again (an unavailable answer is kept no longer than a retry: NOTES #12): none is lost.
    assert redis_client.xlen("failures") == 0
    waiting = sum(queue_depth(amqp_channel, hold_name(level)) for level in HOLD_LEVELS_MS)
    assert waiting == len(urls)
