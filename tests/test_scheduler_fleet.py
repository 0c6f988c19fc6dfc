"""Scheduler processes against real RabbitMQ and Redis: two replicas with one leader, the
leader killed with kill -9 mid-run (no due time enqueued twice, none skipped), and recrawls of
a loopback site by real worker threads whose intervals adapt to how the pages change."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis

from common.broker.messages import WorkMessage
from common.intake.schedule import Schedule
from common.store.keys import SINKS, schedule_key
from devtools.testsite import RequestRecord, TestSite
from tests.helpers import (
    WorkerThread,
    drain,
    leader_id,
    output_of,
    publish_raw,
    results,
    start_scheduler,
    wait_for,
)

LEASE_S = 1.0


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_one_of_two_schedulers_leads_and_a_killed_leader_is_replaced_within_the_lease(
        settings, redis_client, amqp_channel, processes, site):
    interval_ms, n_urls = 1000, 40
    env = {"SCHEDULE_LEASE_S": str(LEASE_S), "SCHEDULE_INTERVAL_S": "1",
           "SCHEDULE_MIN_INTERVAL_S": "1", "SCHEDULE_MAX_INTERVAL_S": "1", "SCHEDULE_BATCH": "7"}
    urls = [site.page_url(n) for n in range(1, n_urls + 1)]
    Schedule(redis_client, settings.with_overrides(schedule_min_interval_s=1)).add(
        [(u, 1, 0) for u in urls], replace=True)
    started_ms = redis_ms(redis_client)
    procs = {name: start_scheduler(settings, name, env) for name in ("sched-a", "sched-b")}
    processes.extend(procs.values())
    assert wait_for(lambda: leader_id(redis_client) is not None, timeout_s=20, step_s=0.01)
    first, startup_ms = leader_id(redis_client), redis_ms(redis_client) - started_ms
    other = next(name for name in procs if name != first)
    time.sleep(3)
    # kill -9 the leader while it holds a batch: taken, maybe published, not rescheduled
    assert wait_for(lambda: redis_client.hlen(schedule_key("inflight")) > 0, timeout_s=10,
                    step_s=0.001)
    procs[first].kill()
    killed = time.monotonic()
    held = {(url.decode(), int(entry.split(b":")[1]))
            for url, entry in redis_client.hgetall(schedule_key("inflight")).items()}
    assert "re-enqueued" not in output_of(procs[other])  # it stood by while the first led
    assert wait_for(lambda: leader_id(redis_client) == other, timeout_s=10, step_s=0.01)
    takeover_s = time.monotonic() - killed
    assert takeover_s <= LEASE_S * 1.25 + 0.5, takeover_s
    time.sleep(3)
    procs[other].send_signal(signal.SIGTERM)
    assert procs[other].wait(15) == 0, output_of(procs[other])
    ended_ms = redis_ms(redis_client)
    assert redis_client.get(schedule_key("lease")) is None  # given up on a clean stop

    bodies = [body for _m, _p, body in drain(amqp_channel, "url_queue_ttl")]
    sent = [WorkMessage.from_json(body) for body in bodies]
    per_due = Counter((m.url, int(m.extra["nonce"].removeprefix("sched:"))) for m in sent)
    twice = {key for key, count in per_due.items() if count > 1}
    # A due time is published twice only if the leader died after the broker had it and
    # before rescheduling it: then both carry the same nonce, so the workers record it once.
    assert twice <= held and max(per_due.values()) <= 2, (twice, held)
    assert held <= set(per_due)  # what the dead leader held was published, none skipped
    dues: dict[str, list[int]] = defaultdict(list)
    for url, due in sorted(per_due):
        dues[url].append(due)
    assert set(dues) == set(urls)
    for url, times in dues.items():
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert all(gap >= interval_ms for gap in gaps), (url, times)  # never scheduled twice
        # no skip: a due time is late by at most the start-up or the takeover, plus a tick
        assert max(gaps) <= interval_ms + max(startup_ms, takeover_s * 1000) + 1000, gaps
        assert times[0] <= started_ms + 2000 and times[-1] >= ended_ms - 4000, (url, times)
    assert redis_client.zcard(schedule_key("due")) == n_urls  # every URL still scheduled
    assert redis_client.hlen(schedule_key("inflight")) == 0
    # A worker turns every due time into exactly one visit: a second copy is acked unfetched
    # (one fetch thread, so copies never race; racing copies still give one result, #14).
    publish_raw(settings, "url_queue_ttl", bodies)
    one = settings.with_overrides(idle_exit_s=1.0, cache_ttl_s=0, concurrency=1)
    with WorkerThread(one) as worker:
        assert worker.join(60) == 0
    assert Counter(r["url"] for r in results(redis_client)) == Counter(u for u, _d in per_due)
    assert sum(site.count(path) for path in {urlsplit(u).path for u in urls}) == len(per_due)
    print(f"start-up {startup_ms} ms, takeover {takeover_s:.2f} s; {len(sent)} messages for {len(per_due)} due times; "
          f"{len(held)} in flight at the kill, {len(twice)} published twice (same nonce)")


class ChangingSite:
    """Routes of a loopback site: ``/changing`` is new at every request (and sends no
    validators), ``/still`` never changes: it sends an ETag and a Last-Modified and answers
    304 Not Modified, without a body, to a request whose If-None-Match is its ETag."""

    ETAG = '"still-1"'
    LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"

    def __init__(self, site: TestSite) -> None:
        self.visits = 0
        self.still_statuses: list[int] = []
        self._lock = threading.Lock()
        site.route("/changing", self._changing)
        site.route("/still", self._still)

    def _changing(self, _record: object) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.visits += 1
            return self._page("Changing", f"edition number {self.visits}")

    def _still(self, record: RequestRecord) -> tuple[int, dict[str, str], bytes]:
        validators = {"ETag": self.ETAG, "Last-Modified": self.LAST_MODIFIED}
        if header(record, "If-None-Match") == self.ETAG:
            status, headers, body = 304, validators, b""
        else:
            status, headers, body = self._page("Still", "the same words every time")
            headers.update(validators)
        with self._lock:
            self.still_statuses.append(status)
        return status, headers, body

    @staticmethod
    def _page(title: str, text: str) -> tuple[int, dict[str, str], bytes]:
        body = f"<html><head><title>{title}</title></head><body><p>{text}</p></body></html>"
        return 200, {"Content-Type": "text/html; charset=utf-8"}, body.encode()


def header(record: RequestRecord, name: str) -> str | None:
    """A request header of ``record`` whatever the case the client sent it in."""
    return next((v for k, v in record.headers.items() if k.lower() == name.lower()), None)


def test_recrawls_revisit_pages_and_their_intervals_adapt_to_change(settings, redis_client,
                                                                   processes):
    env = {"SCHEDULE_LEASE_S": str(LEASE_S), "SCHEDULE_MIN_INTERVAL_S": "1",
           "SCHEDULE_MAX_INTERVAL_S": "8", "SCHEDULE_INTERVAL_S": "4", "CACHE_TTL_S": "0"}
    fast = settings.with_overrides(schedule_min_interval_s=1, schedule_max_interval_s=8,
                                   schedule_interval_s=4, cache_ttl_s=0)
    schedule = Schedule(redis_client, fast)
    with TestSite(pages=3) as site, WorkerThread(fast):
        pages = ChangingSite(site)
        changing, still = site.url("/changing"), site.url("/still")
        assert schedule.add([(changing, 4, 0), (still, 4, 0)], replace=True).added == 2
        # A registered sink that has not read yet holds the trimming of results (the scheduler's
        # own sink trims what it acknowledged), so every record is still there at the end.
        redis_client.sadd(SINKS, "fleet-test-reader")
        processes.append(start_scheduler(settings, "sched-e2e", env))
        converged = wait_for(lambda: (schedule.entry(changing)["interval_s"],
                                      schedule.entry(still)["interval_s"]) == (1, 8),
                             timeout_s=40, step_s=0.2)
        log = output_of(processes[0])
        assert converged, (schedule.entry(changing), schedule.entry(still), log[-3000:])
        time.sleep(3)  # the changing page is now revisited about every second
        requests = {path: site.requests_for(path) for path in ("/changing", "/still")}
        hits = {path: [r.wall_time_s for r in rs] for path, rs in requests.items()}
    assert redis_client.sismember(SINKS, "scheduler")  # it reads results as a sink
    # A visit comes up to a tick (0.25 s) plus a fetch after its due time (the first one
    # also after the site's robots.txt, so the first gap may be a little short).
    def near(gaps: list[float], expected: list[float]) -> bool:
        return all(e - 0.5 <= g <= e + 0.9 for g, e in zip(gaps, expected, strict=True))

    # still: the first visit, then 4 s later (unchanged: 6 s), then 6 s later (8 s, the max)
    still_gaps = [b - a for a, b in zip(hits["/still"], hits["/still"][1:], strict=False)]
    assert near(still_gaps, [4, 6]), still_gaps
    # changing: 4 s, then 2 s (changed), then about every second (the min)
    gaps = [b - a for a, b in zip(hits["/changing"], hits["/changing"][1:], strict=False)]
    assert len(gaps) >= 6 and near(gaps, [4, 2] + [1] * (len(gaps) - 2)), gaps
    entry = schedule.entry(changing)
    assert entry["changes"] == entry["visits"] - 1 >= 6
    # Conditional requests: after the first visit, /still was asked "changed since?" with the
    # validators of the last visit and answered 304, which the worker recorded as unchanged
    # (and the interval still grew to the max, above); /changing sends none, so never asked.
    still_sent = [header(r, "If-None-Match") for r in requests["/still"]]
    assert still_sent[0] is None and len(still_sent) >= 3, still_sent
    assert set(still_sent[1:]) == {ChangingSite.ETAG}, still_sent
    assert all(header(r, "If-Modified-Since") == ChangingSite.LAST_MODIFIED
               for r in requests["/still"][1:])
    assert pages.still_statuses[0] == 200 and set(pages.still_statuses[1:]) == {304}
    assert not any(header(r, "If-None-Match") for r in requests["/changing"])
    records = [r for r in results(redis_client) if r["url"] == still]
    assert records[0]["status"] == 200 and records[0]["etag"] == ChangingSite.ETAG
    assert len(records) >= 3 and all(r["status"] == 304 and r["unchanged"] is True
                                     and "content_hash" not in r for r in records[1:]), records
