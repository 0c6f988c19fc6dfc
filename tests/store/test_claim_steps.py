"""The claim steps the producer takes (common/store/dedupe.py): the seen check and the claim in
one atomic call, seen and unclaimed in one, and who may take whose claim over."""

from __future__ import annotations

from common.core.urls import fingerprint
from common.store.dedupe import PRODUCER_TOKEN_PREFIX, Claims, SeenSet
from common.store.keys import claim_key

PRODUCER_A = f"{PRODUCER_TOKEN_PREFIX}a"
PRODUCER_B = f"{PRODUCER_TOKEN_PREFIX}b"
PAGE = "done:1f:42"


def test_a_seen_url_is_never_claimed_and_a_new_one_is_claimed_in_the_same_call(
        settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    old, new = fingerprint("https://example.test/old"), fingerprint("https://example.test/new")
    seen.add_many([old])
    assert claims.take_unseen(seen, [old, new], PAGE) == [False, True]
    assert not redis_client.exists(claim_key(old.hex))
    assert redis_client.get(claim_key(new.hex)) == PAGE.encode()


def test_a_producers_claim_is_taken_over_by_another_producer_but_never_by_a_page(
        settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    fp = fingerprint("https://example.test/seed")
    assert claims.take_unseen(seen, [fp], PRODUCER_A, take_over=PRODUCER_TOKEN_PREFIX) == [True]
    assert claims.take_unseen(seen, [fp], PAGE) == [False], "a page published a claimed seed"
    assert claims.take_unseen(seen, [fp], PRODUCER_B, take_over=PRODUCER_TOKEN_PREFIX) == [True]
    assert redis_client.get(claim_key(fp.hex)) == PRODUCER_B.encode()


def test_a_pages_claim_is_not_taken_over_by_a_producer(settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    fp = fingerprint("https://example.test/linked")
    assert claims.take_unseen(seen, [fp], PAGE) == [True]
    assert claims.take_unseen(seen, [fp], PRODUCER_A, take_over=PRODUCER_TOKEN_PREFIX) == [False]
    assert claims.take_unseen(seen, [fp], PAGE) == [True], "the page, redelivered, takes it over"


def test_marking_seen_drops_the_claim_and_releasing_drops_only_the_holders(
        settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    mine, theirs = fingerprint("https://example.test/1"), fingerprint("https://example.test/2")
    claims.take_unseen(seen, [mine], PRODUCER_A)
    claims.take_unseen(seen, [theirs], PAGE)
    assert claims.release([mine, theirs], PRODUCER_A) == 1
    assert redis_client.exists(claim_key(theirs.hex)) and not redis_client.exists(
        claim_key(mine.hex))
    claims.mark_seen(seen, [theirs])
    assert seen.contains_many([theirs]) == [True] and not redis_client.exists(
        claim_key(theirs.hex))
