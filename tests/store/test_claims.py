"""Claims on URLs being published (crawl mode), against a real Redis and broker."""

from __future__ import annotations

from common.broker import topology
from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import Claims, SeenSet
from common.store.keys import claim_key
from tests.helpers import drain


def test_a_claim_is_held_by_one_token_and_taken_over_by_the_same_token(redis_client):
    claims, seen = Claims(redis_client, ttl_ms=60_000), SeenSet(redis_client, 16)
    fp = fingerprint("https://example.test/a")
    assert claims.take_unseen(seen, [fp], "page-1") == [True]
    assert claims.take_unseen(seen, [fp], "page-2") == [False]
    assert claims.take_unseen(seen, [fp], "page-1") == [True], \
        "the same page, redelivered, takes it over"
    assert 0 < redis_client.pttl(claim_key(fp.hex)) <= 60_000


def test_a_url_claimed_by_a_dying_page_is_published_once_by_that_page_on_redelivery(
        settings, redis_client, amqp_channel):
    url = "https://example.test/linked"
    fp = fingerprint(url)
    # A page claimed the link, then its worker was killed before the publish was confirmed.
    Claims(redis_client).take_unseen(SeenSet(redis_client, settings.seen_buckets), [fp], "page-A")
    with Producer(settings, redis_client) as producer:
        other = producer.submit([url], claim_token="page-B")
        assert (other.new, other.duplicate) == (0, 1), "another page skips a claimed link"
        redelivered = producer.submit([url], claim_token="page-A")
        assert redelivered.new == 1
    assert [body for *_, body in drain(amqp_channel, topology.NORMAL_QUEUE)][0]
    assert SeenSet(redis_client, settings.seen_buckets).contains_many([fp]) == [True]
    assert not redis_client.exists(claim_key(fp.hex)), "the claim goes once the URL is seen"
