"""Wait: a message early for its not_before is parked again, or dead-lettered past its limit."""

from __future__ import annotations

import time

from common.work.outcome import Park
from common.work.steps.wait import Wait
from tests.work.steps.conftest import failure_of, trip_for


def _step(settings) -> Wait:
    return Wait.from_settings(settings.with_overrides(max_wait_s=60.0))


def test_a_message_with_no_not_before_or_one_just_passed_goes_on(settings):
    assert _step(settings).wait_out(trip_for("http://127.0.0.1:9/a")) is None
    assert _step(settings).wait_out(trip_for("http://127.0.0.1:9/a",
                                             not_before=time.time() - 1)) is None


def test_a_message_seconds_early_is_parked_again_for_what_is_left(settings, give_up):
    trip = trip_for("http://127.0.0.1:9/a", not_before=time.time() + 5)
    end = _step(settings).wait_out(trip)
    assert isinstance(end, Park) and 4000 < end.delay_ms <= 5000
    outcome = give_up.settle(trip, end)
    assert outcome.kind == "delay" and outcome.publishes[0].exchange.startswith("hold")


def test_a_not_before_past_the_wait_limit_is_dead_lettered_as_waited_too_long(settings):
    end = _step(settings).wait_out(trip_for("http://127.0.0.1:9/a",
                                            not_before=time.time() + 600))
    assert failure_of(end) == "waited_too_long"
