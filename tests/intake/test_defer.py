"""Per-domain deferral (common/intake/defer.py): the producer's pacing in Redis and the
releaser's claim → publish → remove, against real Redis and RabbitMQ."""

from __future__ import annotations

import threading
import time
from collections import Counter

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.urls import domain_of, fingerprint
from common.intake.defer import Deferral, Pending, Releaser
from common.intake.producer import Producer
from common.store.dedupe import SeenSet
from common.store.keys import deferred_key
from tests.helpers import WorkerThread, drain, queue_depth, results

BIG = "127.0.0.9"


def _paced(settings, rate=(2, 1000), lead_s=10.0, **more):
    return settings.with_overrides(rate_limit=rate, rate_limit_guard=0.02, defer_lead_s=lead_s,
                                   **more)


def _counts(redis_client) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in redis_client.hgetall(deferred_key("counts")).items()}


def _deferred(redis_client) -> list[tuple[Pending, float]]:
    return [(Pending.from_member(m), score)
            for m, score in redis_client.zrange(deferred_key(), 0, -1, withscores=True)]


def _release_all(settings, redis_client, timeout_s: float = 20.0) -> Releaser:
    releaser = Releaser(settings, threading.Event(), redis_client)
    deadline = time.monotonic() + timeout_s
    while redis_client.zcard(deferred_key()) + redis_client.zcard(deferred_key("inflight")):
        assert time.monotonic() < deadline, "deferred URLs were not released in time"
        _claimed, wait_s = releaser.release_once()
        time.sleep(min(wait_s, 0.2))
    releaser._close_amqp()
    return releaser


def test_a_domains_urls_past_the_lead_wait_in_redis_spaced_at_its_rate(settings, redis_client,
                                                                      amqp_channel):
    paced = _paced(settings)
    urls = [f"http://{BIG}:9/p/{i}" for i in range(50)]
    with Producer(paced, redis_client) as producer:
        summary = producer.submit(urls)
    # 2/second with a 2% guard: one slot every 510 ms; slots 0 .. 9.69 s are within the lead.
    assert (summary.new, summary.deferred, summary.failed) == (50, 30, 0)
    assert summary.per_queue[topology.NORMAL_QUEUE] == 50
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 20
    waiting = _deferred(redis_client)
    assert [p.domain for p, _ in waiting] == [BIG] * 30
    gaps = {round(b - a) for (_, a), (_, b) in zip(waiting, waiting[1:], strict=False)}
    assert gaps == {510}
    assert _counts(redis_client) == {BIG: 30}
    # Deferred URLs are marked seen like published ones: a second submit is all duplicates.
    assert SeenSet(redis_client, settings.seen_buckets).count() == 50
    with Producer(paced, redis_client) as producer:
        assert producer.submit(urls).duplicate == 50


def test_each_domain_is_paced_on_its_own_and_later_batches_queue_behind_earlier_ones(
        settings, redis_client, amqp_channel):
    paced = _paced(settings)
    first = [f"http://{BIG}:9/a/{i}" for i in range(15)]
    mixed = [u for i in range(15) for u in (f"http://{BIG}:9/b/{i}", f"http://127.0.0.8:9/{i}")]
    with Producer(paced, redis_client) as producer:
        assert producer.submit(first).deferred == 0
        later = producer.submit(mixed)
    # The big domain had 15 slots taken: 5 more fit in its lead; the other domain has all 15.
    assert later.deferred == 10
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 15 + 5 + 15
    assert _counts(redis_client) == {BIG: 10}


def test_deferral_off_publishes_everything_at_once(settings, redis_client, amqp_channel):
    with Producer(_paced(settings, lead_s=0), redis_client) as producer:
        summary = producer.submit([f"http://{BIG}:9/p/{i}" for i in range(50)])
    assert (summary.new, summary.deferred) == (50, 0)
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 50
    assert redis_client.exists(deferred_key()) == 0


def test_released_messages_reach_their_queue_unchanged_and_not_before_they_are_due(
        settings, redis_client, amqp_channel):
    # 10/second: a slot every 102 ms; with a 0.2 s lead slots 0 and 102 ms are published, the
    # 18 others are released from 4 ms to 1.74 s after producing.
    paced = _paced(settings, rate=(10, 1000), lead_s=0.2,
                   routing_rules='[{"contains": ["news"], "queue": "priority", "ttl_s": 300}]')
    urls = [f"http://{BIG}:9/news/{i}" for i in range(20)]
    started = time.monotonic()
    with Producer(paced, redis_client) as producer:
        assert producer.submit(urls).deferred == 18
    now = drain(amqp_channel, topology.PRIORITY_QUEUE)
    waiting = {p.body for p, _ in _deferred(redis_client)}
    early, _wait_s = Releaser(paced, threading.Event(), redis_client).claim()
    assert len(early) <= 4 and redis_client.zcard(deferred_key()) >= 14  # the rest are not due yet
    redis_client.zadd(deferred_key("inflight"), dict.fromkeys(early, 0), xx=True)  # hand them back

    _release_all(paced, redis_client)
    assert time.monotonic() - started >= 1.6
    released = drain(amqp_channel, topology.PRIORITY_QUEUE)
    assert {body for _m, _p, body in released} == waiting
    assert all(p.expiration == "300000" and p.delivery_mode == 2 for _m, p, _b in released)
    assert sorted(WorkMessage.from_json(b).url for _m, _p, b in now + released) == sorted(urls)
    assert redis_client.zcard(deferred_key("inflight")) == 0 and _counts(redis_client) == {}


def test_two_releasers_claiming_at_once_never_take_the_same_member(settings, redis_client):
    members = {Pending(f"d{i % 7}", topology.NORMAL_QUEUE, None,
                       WorkMessage(url=f"http://d{i % 7}/{i}").to_json()).member(): 0
               for i in range(3000)}
    redis_client.zadd(deferred_key(), members)
    small_batches = settings.with_overrides(defer_batch=25)
    claims: list[list[bytes]] = [[], []]

    def claim_all(mine: list[bytes]) -> None:
        releaser = Releaser(small_batches, threading.Event(), redis_client)
        while taken := releaser.claim()[0]:
            mine.extend(taken)

    threads = [threading.Thread(target=claim_all, args=(mine,)) for mine in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert claims[0] and claims[1], "both releasers got a share"
    assert not set(claims[0]) & set(claims[1])
    assert sorted(m.decode() for m in claims[0] + claims[1]) == sorted(members)


def test_a_batch_whose_releaser_died_is_claimed_again_once_its_lease_runs_out(
        settings, redis_client, amqp_channel):
    # 100/second (11 ms slots), 0.1 s lead: 10 published, 30 deferred, all due within 0.33 s.
    paced = _paced(settings, rate=(100, 1000), lead_s=0.1, defer_lease_s=1.0, defer_batch=10)
    urls = [f"http://{BIG}:9/{i}" for i in range(40)]
    with Producer(paced, redis_client) as producer:
        assert producer.submit(urls).deferred == 30
    time.sleep(0.5)
    dead, _wait_s = Releaser(paced, threading.Event(), redis_client).claim()
    assert len(dead) == 10  # ...and its releaser is killed: never published, never removed
    survivor = Releaser(paced, threading.Event(), redis_client)
    taken_at = time.monotonic()
    first, _wait_s = survivor.claim()
    assert first and not set(first) & set(dead)  # leased members are not claimed twice
    redis_client.zadd(deferred_key("inflight"), dict.fromkeys(first, 0), xx=True)  # hand them back

    _release_all(paced, redis_client)
    assert time.monotonic() - taken_at >= 0.9  # the dead batch waited for its lease to end
    urls_queued = [WorkMessage.from_json(b).url
                   for _m, _p, b in drain(amqp_channel, topology.NORMAL_QUEUE)]
    assert sorted(urls_queued) == sorted(urls)
    assert _counts(redis_client) == {}


def test_a_producer_killed_between_deferring_and_marking_seen_still_gets_one_result_a_url(
        settings, redis_client, site):
    paced = _paced(settings, rate=(20, 1000), lead_s=0.3)
    urls = [site.page_url(n) for n in range(1, 31)]
    # What a producer killed right after its deferral call leaves: 24 of the URLs deferred,
    # the 6 due now not yet published, none marked seen.
    pending = [Pending(domain_of(url), topology.NORMAL_QUEUE, None,
                       WorkMessage(url=url, fp=fingerprint(url).hex).to_json()) for url in urls]
    assert sum(Deferral(paced, redis_client).defer(pending)) == 24
    assert SeenSet(redis_client, settings.seen_buckets).count() == 0
    with Producer(paced, redis_client) as producer:
        rerun = producer.submit(urls)  # the same input again: every URL deferred again
    assert (rerun.new, rerun.deferred) == (30, 30)
    with WorkerThread(paced.with_overrides(idle_exit_s=3.0, concurrency=4)) as worker:
        assert worker.join(60) == 0
    done = Counter(r["url"] for r in results(redis_client))
    assert set(done) == set(urls) and set(done.values()) == {1}
    assert redis_client.zcard(deferred_key()) + redis_client.zcard(deferred_key("inflight")) == 0


def test_status_shows_deferred_urls_per_domain_and_counts_them_as_to_do(settings, redis_client,
                                                                        amqp_channel):
    from common.ops import stats

    paced = _paced(settings)
    with Producer(paced, redis_client) as producer:
        producer.submit([f"http://{BIG}:9/p/{i}" for i in range(50)])
    snapshot = stats.collect(paced, amqp_channel.connection, redis_client)
    assert snapshot["deferred"]["total"] == 30
    [row] = snapshot["deferred"]["domains"]
    assert row["domain"] == BIG and row["deferred"] == 30 and 24 <= row["through_in_s"] <= 26
    assert snapshot["progress"]["to_do"] == 50  # 20 in url_queue_ttl, 30 deferred
    text = stats.render(snapshot)
    assert "deferred: 30 URLs wait in Redis" in text and f"deferred {BIG}: 30" in text
