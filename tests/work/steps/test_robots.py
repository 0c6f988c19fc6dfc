"""Robots: a path robots.txt disallows is dead-lettered; an allowed one goes on with its rules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.store.keys import COUNTERS
from common.web.ratelimit import RateLimiter
from common.web.robots import robots_fetcher
from common.work.robots_gate import RobotsGate
from common.work.steps.robots import Robots
from devtools.testsite import TestSite
from tests.work.steps.conftest import failure_of, reason, trip_for


@pytest.fixture
def guarded_site() -> Iterator[TestSite]:
    with TestSite(pages=3, robots_txt="User-agent: *\nDisallow: /page/2\n") as site:
        yield site


@pytest.fixture
def step(settings, redis_client) -> Iterator[Robots]:
    gate = RobotsGate(settings, redis_client, RateLimiter(redis_client, settings),
                      robots_fetcher(settings))
    yield Robots(gate)
    gate.fetcher.close()


def test_an_allowed_url_goes_on_with_its_origins_rules(step, guarded_site):
    trip = trip_for(guarded_site.page_url(1))
    assert step.ask_robots(trip) is None
    assert trip.rules is not None and trip.rules.allows(guarded_site.page_url(1))
    assert trip.progress.stage == "robots"
    assert guarded_site.count("/robots.txt") == 1


def test_a_disallowed_url_is_dead_lettered_and_counted(step, guarded_site, redis_client,
                                                       give_up):
    trip = trip_for(guarded_site.page_url(2))
    end = step.ask_robots(trip)
    assert failure_of(end) == "robots_disallowed" and end.unless_done
    assert reason(give_up.settle(trip, end)) == "robots_disallowed"
    assert redis_client.hget(COUNTERS, "robots_blocked") == b"1"
    assert guarded_site.count("/page/2") == 0


def test_with_robots_off_every_url_passes_unasked(guarded_site):
    trip = trip_for(guarded_site.page_url(2))
    assert Robots(None).ask_robots(trip) is None
    assert trip.rules is None and guarded_site.count("/robots.txt") == 0
