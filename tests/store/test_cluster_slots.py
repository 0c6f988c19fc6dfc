"""On a Redis Cluster every script call's keys hash to one slot (docs/design-redis-cluster.md).

Each Lua script in common/ is either placed (its keys, built by the fleet's own key builders
for many URLs and domains, share one hash slot) or refused on a cluster: a new script must be
put in one of the two tables below, so a script cannot bring CROSSSLOT to a cluster unseen.
The seen-set's scripts, split per shard at run time, run against a real cluster in
tests/test_redis_cluster_fleet.py.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import key_slot

from common.core.errors import ConfigError
from common.core.urls import domain_of
from common.store import slots
from common.store.dedupe import DoneSet
from common.store.keys import (
    COUNTERS,
    FAILURES_STREAM,
    RESULTS_STREAM,
    SINKS,
    THROTTLED,
    api_fails_key,
    cookie_jar_key,
    deferred_key,
    deferred_next_key,
    poison_key,
    rate_log_key,
    robots_key,
    schedule_key,
    session_pool_key,
    throttle_key,
    worker_key,
)
from common.store.marks import DoneMark
from common.store.results import record_keys
from common.web.ratelimit import admit_keys
from common.web.robots import forget_failures_calls, origin_of

ROOT = Path(__file__).resolve().parents[2]
#: A client these tests never send a command through: only key names are built.
UNUSED = redis.Redis(host="127.0.0.1", port=9)

#: Scripts whose keys share one slot on a cluster (tested below, one test each).
PLACED = {
    "store/results.py:RECORD_LUA", "web/ratelimit.py:ADMIT_LUA", "web/ratelimit.py:CHARGE_LUA",
    "web/throttle.py:REPORT_LUA",
    "store/dedupe.py:SISMEMBER_EACH_LUA", "store/dedupe.py:SADD_EACH_LUA",
    "store/dedupe.py:CLAIM_UNSEEN_LUA", "store/dedupe.py:SEEN_UNCLAIM_LUA",
    "store/dedupe.py:RELEASE_LUA", "work/expired.py:RELEASE_LUA",
    "web/sessions.py:OPEN_LUA", "web/sessions.py:RETIRE_LUA", "web/sessions.py:SAVE_LUA",
    "intake/crawl.py:SPEND_LUA", "web/robots.py:FORGET_FAILURES_LUA",
    "intake/recrawler.py:HOLD_LUA", "intake/recrawler.py:RELEASE_LUA",
    "intake/schedule_scripts.py:ADD_LUA", "intake/schedule_scripts.py:TAKE_LUA",
    "intake/schedule_scripts.py:SETTLE_LUA", "intake/schedule_scripts.py:LEARN_LUA",
    "intake/defer.py:DEFER_LUA", "intake/defer.py:CLAIM_LUA", "intake/defer.py:SETTLE_LUA",
}
#: Scripts of paths that refuse a cluster (jobs, a job's dlq replay).
REFUSED = {
    "jobs/runner.py:REOPEN_LUA", "jobs/registry.py:START_LUA", "jobs/registry.py:MOVE_LUA",
    "jobs/webhooks.py:QUEUE_LUA", "jobs/webhooks.py:TAKE_LUA", "ops/dlq.py:FORGET_LUA",
    "ops/dlq.py:UNDO_LUA", "work/steps/admit.py:PARK_LUA",
}


#: Pieces of Lua other scripts start with, never run alone.
FRAGMENTS = {"web/throttle.py:FUNCTIONS_LUA", "store/slots.py:GIVEN_LUA"}


@pytest.fixture
def cluster_mode() -> Iterator[None]:
    slots.set_cluster(True)
    try:
        yield
    finally:
        slots.set_cluster(False)


def _urls(count: int = 400) -> list[str]:
    rng = random.Random(31)
    return [f"https://www.site{rng.randrange(150)}.example/p/{rng.randrange(10**6)}?q={i}"
            for i in range(count)]


def _one_slot(keys: list[str]) -> bool:
    return len({key_slot(key.encode()) for key in keys}) == 1


def test_every_lua_script_in_common_is_placed_on_a_cluster_or_refused_there():
    found = set()
    for path in (ROOT / "common").rglob("*.py"):
        for name in re.findall(r"^(\w+_LUA) = ", path.read_text(encoding="utf-8"), re.M):
            found.add(f"{path.relative_to(ROOT / 'common').as_posix()}:{name}")
    assert found - PLACED - REFUSED - FRAGMENTS == set(), "place (or refuse) each new script"
    assert (PLACED | REFUSED | FRAGMENTS) - found == set(), "a script listed here is gone"


def test_the_record_script_s_keys_share_the_url_s_slot_for_results_and_failures(cluster_mode):
    done = DoneSet(UNUSED, 16384)
    for url in _urls():
        mark = done.mark_for(url)
        for stream in (RESULTS_STREAM, FAILURES_STREAM):
            for keys in (record_keys(url, stream, mark, rate_log_key(domain_of(url)), ""),
                         record_keys(url, stream, None, None, "")):
                assert _one_slot(keys), keys
    assert record_keys(url, RESULTS_STREAM, None, None, "")[1].startswith("results:{s")


def test_the_admit_script_s_keys_share_the_domain_s_slot_with_or_without_cache_and_jar(
        cluster_mode):
    done = DoneSet(UNUSED, 16384)
    for url in _urls():
        domain = domain_of(url)
        jar = cookie_jar_key("default", domain, "0.0")
        for keys in (admit_keys(domain, url, done.mark_for(url), None, jar),
                     admit_keys(domain, None, None, None, None)):
            assert _one_slot(keys), keys
        assert key_slot(poison_key(url).encode()) == key_slot(keys[0].encode())


def test_the_throttle_and_session_scripts_keys_share_the_domain_s_slot(cluster_mode):
    for url in _urls():
        site = domain_of(url)
        shard = slots.domain_shard(site)
        assert _one_slot([throttle_key(site), slots.part(THROTTLED, shard)])
        assert _one_slot([session_pool_key("default", site), cookie_jar_key("default", site, "1.0"),
                          slots.part(COUNTERS, shard)])


def test_the_fleet_wide_parts_and_heartbeats_are_spread_or_together_as_designed(cluster_mode):
    owners = [key_slot(slots.part(RESULTS_STREAM, s).encode()) * 3 // 16384
              for s in range(slots.SHARDS)]
    assert [owners.count(p) for p in range(3)] == [4, 4, 4], "shards even over 3 primaries"
    assert all(_one_slot([slots.part(name, s) for name in (RESULTS_STREAM, SINKS, COUNTERS)])
               for s in range(slots.SHARDS))
    assert _one_slot([worker_key("a"), worker_key("b")]), "heartbeats: one MGET"
    assert _one_slot([api_fails_key("user:ana"), api_fails_key("addr:127.0.0.1")]), "a login"


def test_the_robots_forget_script_is_called_once_per_slot_on_a_cluster_once_on_one_node(
        cluster_mode):
    origins = {origin_of(url) for url in _urls()} | {f"http://127.0.0.{n}:80{n}"
                                                       for n in range(1, 60)}
    calls = forget_failures_calls(origins)
    assert all(_one_slot(keys) for keys in calls), calls
    assert sorted(key for keys in calls for key in keys) == sorted(map(robots_key, origins))
    assert len(calls) == len({key_slot(robots_key(o).encode()) for o in origins}) > 100
    slots.set_cluster(False)
    assert forget_failures_calls(["http://b.test", "http://a.test"]) == [
        ["robots:http://a.test", "robots:http://b.test"]], "one call for every origin"


def test_the_recrawl_scheduler_s_keys_share_one_slot_on_a_cluster(cluster_mode):
    names = ("due", "inflight", "state", "lease", "fence")
    assert _one_slot([schedule_key(name) for name in names]), "its scripts and its lease"
    assert schedule_key("due") == "schedule:{schedule}:due"
    slots.set_cluster(False)
    assert [schedule_key(name) for name in names] == [f"schedule:{name}" for name in names]


def test_deferral_s_keys_share_one_slot_on_a_cluster_whatever_the_domains(cluster_mode):
    domains = sorted({domain_of(url) for url in _urls()})
    assert _one_slot([deferred_key(), deferred_key("inflight"), deferred_key("counts"),
                      *map(deferred_next_key, domains)]), "defer, claim and settle"
    assert deferred_next_key("a.test") == "deferred:{deferred}:next:a.test"
    slots.set_cluster(False)
    assert (deferred_key(), deferred_key("inflight"), deferred_next_key("a.test")) == (
        "deferred", "deferred:inflight", "deferred:next:a.test")


def test_outside_cluster_mode_every_key_keeps_its_single_node_name():
    mark = DoneMark("done:1f", 7)
    assert record_keys("http://a.test/", RESULTS_STREAM, mark, None, "") == [
        "done:1f", "results", "content:http://a.test/", "stats:counters",
        "failures:http://a.test/", "", "sinks", ""]
    assert admit_keys("a.test", None, None, None, None) == [
        "", "ratelimit:a.test", "ratelimit:a.test:next", "", "throttle:a.test", "throttled"]
    assert (slots.parts(RESULTS_STREAM), worker_key("w1")) == (["results"], "workers:w1")


def test_a_job_s_fleet_wide_keys_are_refused_on_a_cluster_not_sent_cross_slot(cluster_mode):
    with pytest.raises(ConfigError, match="job's run counters.*Redis Cluster"):
        record_keys("http://a.test/", RESULTS_STREAM, None, None, "job:x:run:1")
