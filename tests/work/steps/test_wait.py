"""Wait: a message early for its not_before is parked again, or dead-lettered past its limit."""

from __future__ import annotations

import time

from common.work.steps.wait import Wait
from tests.work.steps.conftest import reason, trip_for


def test_a_message_with_no_not_before_or_one_just_passed_goes_on(settings, give_up):
    step = Wait.from_settings(settings.with_overrides(max_wait_s=60.0), give_up)
    assert step.wait_out(trip_for("http://127.0.0.1:9/a")) is None
    assert step.wait_out(trip_for("http://127.0.0.1:9/a", not_before=time.time() - 1)) is None


def test_a_message_seconds_early_is_parked_on_a_hold_queue(settings, give_up):
    step = Wait.from_settings(settings.with_overrides(max_wait_s=60.0), give_up)
    outcome = step.wait_out(trip_for("http://127.0.0.1:9/a", not_before=time.time() + 5))
    assert outcome is not None and outcome.kind == "delay"
    assert outcome.publishes[0].exchange.startswith("hold")


def test_a_not_before_past_the_wait_limit_is_dead_lettered_as_waited_too_long(settings,
                                                                               give_up):
    step = Wait.from_settings(settings.with_overrides(max_wait_s=60.0), give_up)
    outcome = step.wait_out(trip_for("http://127.0.0.1:9/a", not_before=time.time() + 600))
    assert reason(outcome) == "waited_too_long"
