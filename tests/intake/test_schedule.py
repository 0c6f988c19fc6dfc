"""The recrawl schedule against real Redis and RabbitMQ: the adaptive intervals, adding URLs
(by hand and from sitemaps), the lease and its fencing token, taking and settling due URLs,
one scheduler tick through the producer path. Whole scheduler processes (kill -9, the loopback
site with real workers) are tests/test_scheduler_fleet.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from common.broker.messages import WorkMessage
from common.core.values import parse_duration
from common.intake.recrawler import (
    Learner,
    Lease,
    Recrawler,
    RecrawlProducer,
    first_interval,
    schedule_entries,
)
from common.intake.schedule import Schedule, observation, validators
from common.intake.sitemap_files import Entry
from common.sink.reader import Entry as StreamEntry
from common.store.keys import schedule_key
from devtools.testsite import TestSite
from tests.helpers import drain
from tests.intake.sitemap_bodies import NS

URL = "https://example.test/page"


@pytest.fixture
def schedule(settings, redis_client) -> Schedule:
    return Schedule(redis_client, settings.with_overrides(
        schedule_min_interval_s=60, schedule_max_interval_s=3600, schedule_interval_s=1000,
        schedule_growth=0.5, schedule_shrink=0.5))


def interval(schedule: Schedule, url: str = URL) -> int:
    return schedule.entry(url)["interval_s"]


def visits(schedule: Schedule, hashes: list[str], url: str = URL, first_ms: int = 1000,
           kind: str = "h") -> list[int]:
    """Learn one visit per hash (stream ids growing); the interval after each."""
    out = []
    for n, digest in enumerate(hashes):
        schedule.learn([(url, f"{first_ms + n}-0", kind, digest)])
        out.append(interval(schedule, url))
    return out


# -- the adaptive rule ------------------------------------------------------------------------


def test_a_page_that_changes_at_every_visit_converges_to_the_min_interval(schedule):
    schedule.add([(URL, 1000, 0)], replace=True)
    got = visits(schedule, [f"hash{n}" for n in range(13)])
    # The first visit is the baseline; then i = floor(0.5·i + 0.5·60) at every change.
    assert got == [1000, 530, 295, 177, 118, 89, 74, 67, 63, 61, 60, 60, 60]
    assert schedule.entry(URL)["changes"] == 12


def test_a_page_that_never_changes_grows_to_the_max_interval(schedule):
    schedule.add([(URL, 1000, 0)], replace=True)
    assert visits(schedule, ["same"] * 6) == [1000, 1500, 2250, 3375, 3600, 3600]
    assert schedule.entry(URL)["changes"] == 0


def test_a_304_counts_as_unchanged_and_keeps_the_last_hash(schedule):
    schedule.add([(URL, 1000, 0)], replace=True)
    visits(schedule, ["a"])
    assert observation({"url": URL, "status": 304, "unchanged": True}) == ("u", "")
    schedule.learn([(URL, "2000-0", "u", "")])
    assert interval(schedule) == 1500
    schedule.learn([(URL, "2001-0", "h", "a")])  # same as before the 304: unchanged
    assert interval(schedule) == 2250


@pytest.mark.parametrize("record", [
    {"status": 200, "content_hash": "x", "cached": True},   # the cache answered
    {"status": 200, "content_type": "application/pdf"},       # no hash
    {"status": 503, "content_hash": "x"},                      # not a 2xx page
])
def test_visits_with_nothing_to_compare_leave_the_interval_alone(schedule, record):
    schedule.add([(URL, 1000, 0)], replace=True)
    visits(schedule, ["a"])
    assert observation(record) == ("n", "")
    schedule.learn([(URL, "2000-0", *observation(record))])
    assert interval(schedule) == 1000
    assert schedule.entry(URL)["visits"] == 2


def test_a_replayed_result_changes_nothing(schedule):
    schedule.add([(URL, 1000, 0)], replace=True)
    visits(schedule, ["a", "b"])
    assert interval(schedule) == 530
    schedule.learn([(URL, "1001-0", "h", "b"), (URL, "1000-0", "h", "a")])  # a sink replay
    assert interval(schedule) == 530 and schedule.entry(URL)["visits"] == 2


def test_a_change_moves_the_next_visit_to_now_plus_the_new_interval(schedule, redis_client):
    schedule.add([(URL, 1000, 0)], replace=True)
    visits(schedule, ["a", "b"])
    now_s = redis_client.time()[0]
    assert redis_client.zscore(schedule_key("due"), URL) / 1000 == pytest.approx(now_s + 530, abs=2)


def test_results_of_urls_not_scheduled_are_ignored(schedule, redis_client):
    learner = Learner(schedule)
    learner.write([StreamEntry("results", "5-0", {"url": URL, "status": 200,
                                                  "content_hash": "a"}),
                   StreamEntry("failures", "6-0", {"url": URL, "outcome": "dead_letter"})])
    assert schedule.entry(URL) is None and redis_client.zcard(schedule_key("due")) == 0


# -- validators (conditional requests) -------------------------------------------------------


def stored(redis_client, url: str = URL) -> dict[str, str]:
    """The validators schedule:state holds for ``url`` (its ``e`` and ``m`` fields)."""
    state = json.loads(redis_client.hget(schedule_key("state"), url))
    return {k: state[k] for k in ("e", "m") if k in state}


def learn_records(schedule: Schedule, *records: dict, first_ms: int = 1000) -> None:
    """Feed result records to the Learner as the results sink would, stream ids growing."""
    Learner(schedule).write([StreamEntry("results", f"{first_ms + n}-0", {"url": URL, **r})
                             for n, r in enumerate(records)])


def test_a_visit_stores_its_validators_and_a_304_without_them_keeps_them(schedule,
                                                                         redis_client):
    schedule.add([(URL, 1000, 0)], replace=True)
    modified = "Wed, 21 Oct 2015 07:28:00 GMT"
    learn_records(schedule, {"status": 200, "content_hash": "a", "etag": '"v1"',
                             "last_modified": modified})
    assert stored(redis_client) == {"e": '"v1"', "m": modified}
    learn_records(schedule, {"status": 304, "unchanged": True}, first_ms=2000)
    assert stored(redis_client) == {"e": '"v1"', "m": modified}
    assert interval(schedule) == 1500  # the 304 still counts as unchanged
    learn_records(schedule, {"status": 503}, {"status": 200, "content_hash": "a", "cached": True},
                  first_ms=3000)
    assert stored(redis_client) == {"e": '"v1"', "m": modified}
    assert schedule.entry(URL)["visits"] == 4


def test_a_new_page_replaces_both_validators_and_a_304_updates_those_it_carries(schedule,
                                                                                redis_client):
    schedule.add([(URL, 1000, 0)], replace=True)
    learn_records(schedule, {"status": 200, "content_hash": "a", "etag": '"v1"',
                             "last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"},
                  {"status": 304, "unchanged": True, "etag": 'W/"v1-gzip"'})
    assert stored(redis_client) == {"e": 'W/"v1-gzip"', "m": "Wed, 21 Oct 2015 07:28:00 GMT"}
    learn_records(schedule, {"status": 200, "content_hash": "b", "etag": '"v2"'},
                  first_ms=2000)
    assert stored(redis_client) == {"e": '"v2"'}  # the old date described the old page
    assert interval(schedule) == 780  # grown at the 304 (1500), then shrunk at the change


def test_validators_of_an_unscheduled_url_or_an_older_record_are_not_stored(schedule,
                                                                              redis_client):
    learn_records(schedule, {"status": 200, "content_hash": "a", "etag": '"v1"'})
    assert redis_client.hget(schedule_key("state"), URL) is None  # nothing for an unscheduled URL
    schedule.add([(URL, 1000, 0)], replace=True)
    learn_records(schedule, {"status": 200, "content_hash": "a", "etag": '"v2"'},
                  first_ms=2000)
    learn_records(schedule, {"status": 200, "content_hash": "a", "etag": '"v1"'})  # a replay
    assert stored(redis_client) == {"e": '"v2"'}


@pytest.mark.parametrize("record", [
    {"status": 200, "etag": '"a"\r\nX-Injected: 1'},  # a line break would add a header
    {"status": 200, "etag": "x" * 257},
    {"status": 200, "etag": '"caf\u00e9"'},
    {"status": 404, "etag": '"a"'},                   # not the page's validator
    {"status": 200, "etag": 7},
])
def test_a_validator_that_cannot_go_back_as_a_header_is_not_kept(record):
    assert validators(record) == ("", "")


def test_a_tick_publishes_each_url_with_the_validators_of_its_last_visit(
        settings, schedule, redis_client, amqp_channel):
    plain, both = "https://example.test/plain", "https://example.test/both"
    schedule.add([(u, 100, 0) for u in (URL, plain, both)], replace=True)
    Learner(schedule).write([
        StreamEntry("results", "1-0", {"url": URL, "status": 200, "etag": '"v1"'}),
        StreamEntry("results", "2-0", {"url": both, "status": 200, "etag": '"v9"',
                                       "last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        StreamEntry("results", "3-0", {"url": plain, "status": 200, "content_hash": "x"})])
    lease = Lease(redis_client, 5000, "me")
    with RecrawlProducer(settings, redis_client) as producer:
        recrawler = Recrawler(settings, schedule, lease, producer)
        recrawler.token = lease.hold()
        assert recrawler.tick() == 3
    sent = {m.url: m.extra for m in (WorkMessage.from_json(b) for _m, _p, b
                                      in drain(amqp_channel, "url_queue_ttl"))}
    assert sent[URL]["validators"] == {"etag": '"v1"'}
    assert sent[both]["validators"] == {"etag": '"v9"',
                                        "last_modified": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert "validators" not in sent[plain]  # a site that sent none: no conditional request
    assert all(extra["nonce"].startswith("sched:") for extra in sent.values())


# -- adding URLs ------------------------------------------------------------------------------


def test_add_canonicalises_clamps_and_replaces_or_keeps(schedule):
    got = schedule.add([("HTTPS://Example.test/page#frag", 10, 0), ("not a url", 100, 0),
                        ("https://example.test/b", 10 ** 9, 0)], replace=True)
    assert (got.added, got.invalid) == (2, 1)
    assert interval(schedule) == 60 and interval(schedule, "https://example.test/b") == 3600
    assert schedule.add([(URL, 500, 0)], replace=False).kept == 1
    assert interval(schedule) == 60
    assert schedule.add([(URL, 500, 0)], replace=True).updated == 1
    assert interval(schedule) == 500
    assert schedule.remove([URL]) == 1 and schedule.entry(URL) is None


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900),
                                               ("6h", 21600), ("1d", 86400), ("2w", 1209600),
                                               ("1.5h", 5400)])
def test_durations_read_as_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "1y", "-5m", "soon"])
def test_a_bad_duration_is_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_a_sitemap_url_starts_from_its_changefreq_else_its_lastmod_else_the_default(schedule):
    now = datetime(2026, 11, 20, tzinfo=UTC)
    assert first_interval(1000, "hourly", now - timedelta(days=30), now) == 3600
    assert first_interval(1000, None, now - timedelta(hours=1), now) == 1800
    assert first_interval(1000, "sometimes", None, now) == 1000
    got = schedule_entries(schedule, [Entry(URL, None, "always"),
                                      Entry("https://example.test/old", now, "never"),
                                      Entry("https://example.test/x")])
    assert got.added == 3
    assert [interval(schedule, u) for u in (URL, "https://example.test/old",
                                            "https://example.test/x")] == [60, 3600, 1000]
    again = schedule_entries(schedule, [Entry(URL, None, "yearly")])
    assert again.kept == 1 and interval(schedule) == 60  # a re-read keeps what was learned


@pytest.fixture
def sitemap_site() -> Iterator[TestSite]:
    with TestSite(pages=5) as site:
        yield site


def test_the_sitemap_command_seeds_and_schedules_with_changefreq(sitemap_site, run_cli,
                                                                 redis_client, amqp_channel):
    urls = [sitemap_site.page_url(n) for n in (1, 2, 3)]
    body = (f'<?xml version="1.0"?><urlset xmlns="{NS}">'
            f"<url><loc>{urls[0]}</loc><changefreq>Hourly</changefreq></url>"
            f"<url><loc>{urls[1]}</loc><changefreq>weekly</changefreq></url>"
            f"<url><loc>{urls[2]}</loc></url></urlset>").encode()
    sitemap_site.route("/sitemap.xml", lambda _r: (200, {"Content-Type": "text/xml"}, body))
    env = {"SCHEDULE_MIN_INTERVAL_S": "60", "SCHEDULE_INTERVAL_S": "7200"}
    out = run_cli("scheduler.py", "sitemap", sitemap_site.url("/sitemap.xml"), env=env)
    assert out.returncode == 0, out.stderr
    assert "new=3" in out.stdout and "scheduled: added=3" in out.stdout
    shown = run_cli("scheduler.py", "show", *urls, env=env)
    assert [e["interval_s"] for e in json.loads(shown.stdout)] == [3600, 7 * 86400, 7200]
    now_s = redis_client.time()[0]
    assert redis_client.zscore(schedule_key("due"), urls[0]) / 1000 == pytest.approx(now_s + 3600,
                                                                              abs=5)
    assert len(drain(amqp_channel, "url_queue_ttl")) == 3  # seeded once, now


# -- lease, take, settle ----------------------------------------------------------------------


def test_one_of_two_replicas_holds_the_lease_and_the_next_holder_gets_a_higher_token(
        redis_client):
    a, b = Lease(redis_client, 300, "a"), Lease(redis_client, 300, "b")
    assert a.hold() == 1 and b.hold() == 0
    assert a.hold() == 1  # renewed
    time.sleep(0.4)       # a stopped renewing: its lease expires by itself
    assert b.hold() == 2 and a.hold() == 0
    assert not a.release() and b.release()
    assert redis_client.get(schedule_key("lease")) is None and a.hold() == 3


def test_a_deposed_leader_takes_nothing_and_settles_nothing(schedule, redis_client):
    schedule.add([(f"https://example.test/{n}", 100, 0) for n in range(10)], replace=True)
    old, new = Lease(redis_client, 200, "old"), Lease(redis_client, 200, "new")
    token = old.hold()
    taken = schedule.take(token, 4, stale_ms=200)
    assert len(taken) == 4 and redis_client.hlen(schedule_key("inflight")) == 4
    time.sleep(0.3)  # the old leader hangs; its lease expires
    token2 = new.hold()
    assert token2 > token and schedule.take(token, 4, stale_ms=200) is None
    again = schedule.take(token2, 100, stale_ms=200)
    # the new leader takes over the 4 in flight (a lease old) with their own due times
    assert {(d.url, d.due_ms) for d in taken} <= {(d.url, d.due_ms) for d in again}
    assert len(again) == 10 and len({d.url for d in again}) == 10
    assert schedule.settle(token, [d.url for d in taken]) == 0  # no longer the old one's
    assert schedule.settle(token2, [d.url for d in again]) == 10
    assert redis_client.hlen(schedule_key("inflight")) == 0
    assert redis_client.zcard(schedule_key("due")) == 10


def test_entries_of_an_older_token_wait_a_lease_before_they_are_taken_over(schedule,
                                                                           redis_client):
    schedule.add([(URL, 100, 0)], replace=True)
    old, new = Lease(redis_client, 5000, "old"), Lease(redis_client, 5000, "new")
    taken = schedule.take(old.hold(), 10, stale_ms=5000)
    old.release()
    assert schedule.take(new.hold(), 10, stale_ms=5000) == []  # the old one may still publish
    assert schedule.take(new.hold(), 10, stale_ms=0) == taken


def test_urls_not_published_go_back_to_their_due_time(schedule, redis_client):
    schedule.add([(URL, 100, 0)], replace=True)
    lease = Lease(redis_client, 5000, "me")
    token = lease.hold()
    [due] = schedule.take(token, 10, stale_ms=5000)
    assert schedule.release(token, [URL]) == 1
    assert redis_client.zscore(schedule_key("due"), URL) == due.due_ms
    assert schedule.take(token, 10, stale_ms=5000) == [due]  # taken again, same due time


def test_a_tick_publishes_due_urls_as_recrawls_with_their_due_time_nonce(
        settings, schedule, redis_client, amqp_channel):
    urls = [f"https://example.test/news/{n}" for n in range(3)] + ["https://example.test/a"]
    schedule.add([(u, 100, 0) for u in urls], replace=True)
    schedule.add([("https://example.test/later", 100, 3600)], replace=True)
    lease = Lease(redis_client, 5000, "me")
    with RecrawlProducer(settings, redis_client) as producer:
        recrawler = Recrawler(settings, schedule, lease, producer)
        recrawler.token = lease.hold()
        assert recrawler.tick() == 4
        assert recrawler.tick() == 0  # nothing else is due
    messages = {q: [WorkMessage.from_json(b) for _m, _p, b in drain(amqp_channel, q)]
                for q in ("priority_queue", "url_queue_ttl")}
    assert sorted(m.url for m in messages["priority_queue"]) == urls[:3]  # routing rules
    assert [m.url for m in messages["url_queue_ttl"]] == urls[3:]
    sent = {m.url: m.extra["nonce"] for ms in messages.values() for m in ms}
    assert all(nonce.startswith("sched:") for nonce in sent.values())
    assert redis_client.hlen(schedule_key("inflight")) == 0
    now_s = redis_client.time()[0]
    for url in urls:  # rescheduled one interval on
        assert redis_client.zscore(schedule_key("due"), url) / 1000 == pytest.approx(
            now_s + 100, abs=3)


def test_the_add_show_and_remove_commands(run_cli, tmp_path, redis_client):
    seeds = tmp_path / "urls.txt"
    seeds.write_text("https://example.test/a\n# a comment\nhttps://example.test/b\nnot a url\n")
    env = {"SCHEDULE_MIN_INTERVAL_S": "60"}
    out = run_cli("scheduler.py", "add", "-f", str(seeds), "--interval", "6h", "--delay",
                  "10m", env=env)
    assert out.returncode == 1 and "added=2 updated=0 kept=0 invalid=1" in out.stdout
    status = json.loads(run_cli("scheduler.py", "show", env=env).stdout)
    assert status["scheduled"] == 2 and status["due"] == 0 and status["leader"] is None
    assert 590 <= status["next_visit_in_s"] <= 600
    [entry] = json.loads(run_cli("scheduler.py", "show", "https://example.test/a").stdout)
    assert entry["interval_s"] == 6 * 3600 and not entry["in_flight"]
    again = run_cli("scheduler.py", "add", "--keep", "https://example.test/a", env=env)
    assert again.returncode == 0 and "kept=1" in again.stdout
    assert run_cli("scheduler.py", "remove", "https://example.test/a").stdout == "removed=1\n"
    bad = run_cli("scheduler.py", "add", "--interval", "soon", "https://example.test/a")
    assert bad.returncode == 2 and "duration" in bad.stderr
    assert redis_client.zcard(schedule_key("due")) == 1


def test_due_urls_wait_in_the_schedule_while_the_work_queues_are_full(
        settings, schedule, redis_client, amqp_channel):
    schedule.add([(f"https://example.test/{n}", 100, 0) for n in range(5)], replace=True)
    lease = Lease(redis_client, 5000, "me")
    full = settings.with_overrides(schedule_max_queued=3, schedule_batch=2)
    with RecrawlProducer(full, redis_client) as producer:
        recrawler = Recrawler(full, schedule, lease, producer)
        recrawler.token = lease.hold()
        assert [recrawler.tick(), recrawler.tick()] == [2, 2]
        assert recrawler.tick() == 0 and recrawler.holding  # 4 queued: held back
        assert redis_client.zcard(schedule_key("due")) == 5
        assert redis_client.hlen(schedule_key("inflight")) == 0
        drain(amqp_channel, "url_queue_ttl")
        assert recrawler.tick() == 1 and not recrawler.holding
