"""The dedupe scripts for a job's run (common/store/dedupe.py): the page budget in the claim
script (known plus live reservations, across callers), ``known`` counted in the mark-seen
script, reservations dropped by a release or their lease, the done mark scoped to a run."""

from __future__ import annotations

import time

from common.core.urls import fingerprint, job_fingerprint
from common.store.dedupe import (
    HELD,
    OVER_BUDGET,
    PRODUCER_TOKEN_PREFIX,
    TAKEN,
    Claims,
    DoneSet,
    RunBudget,
    SeenSet,
)
from common.store.keys import claim_key

A = f"{PRODUCER_TOKEN_PREFIX}a"
PAGE = "done:1f:42"
RUN = RunBudget("shop", 1, pages=5)


def _fps(prefix: str, n: int):
    return [job_fingerprint(f"https://example.test/{prefix}/{i}", "shop/1") for i in range(n)]


def _known(redis_client) -> int:
    return int(redis_client.hget(RUN.counters, "known") or 0)


def test_claims_in_flight_count_against_the_budget_of_every_other_caller(settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    mine, theirs = _fps("a", 3), _fps("b", 4)
    assert claims.take_unseen(seen, mine, A, budget=RUN) == [HELD] * 3
    assert claims.take_unseen(seen, theirs, PAGE, budget=RUN) == [HELD, HELD, OVER_BUDGET,
                                                                  OVER_BUDGET]
    assert not redis_client.exists(claim_key(theirs[2].hex)), "an over-budget URL was claimed"
    assert claims.take_unseen(seen, mine, A, budget=RUN) == [HELD] * 3, (
        "a caller's own claims are already within the budget")
    assert claims.mark_seen(seen, mine, RUN) == 3
    assert claims.mark_seen(seen, theirs[:2], RUN) == 2
    assert _known(redis_client) == 5
    assert redis_client.zcard(RUN.reservations) == 0
    assert claims.take_unseen(seen, [*mine, *_fps("c", 1)], A, budget=RUN) == [TAKEN] * 3 + [
        OVER_BUDGET]


def test_marking_seen_again_counts_nothing_more(settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    fps = _fps("x", 4)
    claims.take_unseen(seen, fps, A, budget=RUN)
    assert claims.mark_seen(seen, fps, RUN) == 4
    assert claims.mark_seen(seen, fps, RUN) == 0
    assert _known(redis_client) == 4


def test_a_release_or_a_lapsed_lease_gives_the_budget_back(settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    fps = _fps("r", 5)
    claims = Claims(redis_client)
    assert claims.take_unseen(seen, fps, A, budget=RUN) == [HELD] * 5
    assert claims.release(fps[:2], A, RUN) == 2
    assert claims.take_unseen(seen, _fps("s", 3), PAGE, budget=RUN) == [HELD, HELD, OVER_BUDGET]
    short = Claims(redis_client, ttl_ms=50)
    run = RunBudget("shop", 2, pages=1)
    assert short.take_unseen(seen, _fps("t", 1), A, budget=run) == [HELD]
    assert short.take_unseen(seen, _fps("u", 1), PAGE, budget=run) == [OVER_BUDGET]
    time.sleep(0.1)  # the first caller died: its claim and reservation lapse together
    assert short.take_unseen(seen, _fps("u", 1), PAGE, budget=run) == [HELD]


def test_without_a_page_limit_the_run_still_counts_known(settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    claims = Claims(redis_client)
    run = RunBudget("shop", 1)
    fps = _fps("free", 50)
    assert claims.take_unseen(seen, fps, A, budget=run) == [HELD] * 50
    assert not redis_client.exists(run.reservations)
    claims.mark_seen(seen, fps, run)
    assert _known(redis_client) == 50


def test_a_runs_done_mark_is_its_own_and_forgotten_alone(settings, redis_client):
    done = DoneSet(redis_client, settings.seen_buckets)
    url = "https://example.test/page"
    plain, scoped = done.mark_for(url), done.mark_for(url, scope="shop/1")
    assert plain.member == fingerprint(url).member
    assert scoped.member == job_fingerprint(url, "shop/1").member != plain.member
    assert done.mark_for(url, "n1", "shop/1") != done.mark_for(url, "n1")
    done.add(plain)
    done.add(scoped)
    assert done.forget([url], scope="shop/1") == 1
    assert (done.contains(plain), done.contains(scoped)) == (True, False)
