"""Follow: the page's links go through the producer path; a follower exists for user code too."""

from __future__ import annotations

from common.work.follow import FollowPlan
from common.work.page_record import PageRead
from common.work.steps.follow import Follow
from tests.helpers import queue_depth
from tests.work.steps.conftest import QUEUE, response, trip_for


def _read(url: str, links: tuple[str, ...], give_up):
    trip = trip_for(url)
    trip.response = response(url)
    trip.done = give_up.done_mark(trip.url, trip.message)
    trip.read = PageRead({"url": url}, follow=FollowPlan(links, max_depth=2, priority=False))
    return trip


def test_in_crawl_mode_the_pages_new_links_are_published_and_counted(settings, redis_client,
                                                                      amqp_channel,
                                                                      give_up):
    crawl = settings.with_overrides(crawl_enabled=True, crawl_max_depth=2)
    step = Follow(Follow.follower_for(crawl, redis_client))
    try:
        trip = _read("http://127.0.0.1:9/a", ("http://127.0.0.1:9/b", "http://127.0.0.1:9/c",
                                              "http://127.0.0.2:9/elsewhere"), give_up)
        assert step.follow_links(trip) is None
    finally:
        step.close()
    assert trip.read.record["followed"] == 2  # the other host is out of scope
    assert trip.progress.stage == "record"
    assert queue_depth(amqp_channel, QUEUE) == 2


def test_a_follower_is_built_for_crawl_mode_handlers_or_extractor_and_only_then(
        settings, redis_client):
    made = [Follow.follower_for(settings.with_overrides(**knob), redis_client)
            for knob in ({"crawl_enabled": True}, {"handlers": "site.routes:router"},
                         {"extractor": "site.extract:extract"}, {})]
    assert [follower is not None for follower in made] == [True, True, True, False]
    for follower in made[:3]:
        follower.close()


def test_without_a_follower_a_page_with_no_follow_requests_passes(give_up):
    trip = _read("http://127.0.0.1:9/a", ("http://127.0.0.1:9/b",), give_up)
    assert Follow(None).follow_links(trip) is None
    assert "followed" not in trip.read.record
