"""A hostile or broken message ends: no endless waits, no unbounded log lines or records.

Issue 23. Real Redis (the processor's dead-letter counters), a Processor called directly where
no fetch is needed, a Worker in a thread where one is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.work.outcome import Outcome
from common.work.processor import Processor
from tests.helpers import WorkerThread, publish_raw, queue_depth, results, wait_for

QUEUE = topology.NORMAL_QUEUE


@pytest.fixture
def processor(settings: Settings, redis_client: Any) -> Iterator[Processor]:
    made = Processor(settings.with_overrides(max_wait_s=60.0, robots_enabled=False),
                     redis_client)
    try:
        yield made
    finally:
        made.close()


def _reason(outcome: Outcome) -> str | None:
    if outcome.kind != "dead_letter":
        return None
    return (outcome.publishes[0].headers or {}).get("reason")


def _body(**extra: Any) -> bytes:
    return WorkMessage(url="http://127.0.0.1:9/page", extra=extra).to_json()


@pytest.mark.parametrize("not_before", ["far", 1e300])
def test_a_not_before_beyond_the_wait_limit_is_dead_lettered_as_waited_too_long(
        processor, not_before):
    if not_before == "far":
        not_before = time.time() + 600  # MAX_WAIT_S is 60 s
    outcome = processor.process(_body(not_before=not_before), QUEUE)
    assert _reason(outcome) == "waited_too_long", outcome


def test_a_far_parked_at_does_not_stretch_the_wait_limit_without_end(processor):
    outcome = processor.process(_body(not_before=1e300, parked_at=1e300), QUEUE)
    assert _reason(outcome) == "waited_too_long", outcome


def test_a_turn_within_the_wait_limit_is_still_parked(processor):
    now = time.time()
    outcome = processor.process(_body(not_before=now + 5, parked_at=now - 50), QUEUE)
    assert outcome.kind == "delay", outcome


def test_a_retry_backoff_longer_than_max_wait_s_is_still_parked(processor):
    # A retry's backoff (Retry-After up to RETRY_AFTER_MAX_S) starts MAX_WAIT_S after it.
    later = time.time() + 600
    outcome = processor.process(_body(not_before=later, parked_at=later), QUEUE)
    assert outcome.kind == "delay", outcome


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_a_non_finite_not_before_is_dead_lettered_as_a_bad_message(processor, constant):
    body = b'{"url": "http://127.0.0.1:9/page", "not_before": ' + constant + b"}"
    assert _reason(processor.process(body, QUEUE)) == "bad_message"


def test_a_five_megabyte_url_gives_a_short_log_line(settings, redis_client, amqp_channel,
                                                    caplog):
    huge = "http://127.0.0.1:9/" + "a" * 5_000_000
    publish_raw(settings, QUEUE, [WorkMessage(url=huge).to_json()])
    with caplog.at_level(logging.INFO), WorkerThread(settings) as _worker:
        assert wait_for(lambda: queue_depth(amqp_channel, topology.FAILED_QUEUE) == 1, 20)
    lines = [r.getMessage() for r in caplog.records if "invalid_url" in r.getMessage()]
    assert lines, [r.getMessage()[:200] for r in caplog.records]
    assert max(len(line) for line in lines) < 5000
    assert "…[+" in lines[0] and "chars]" in lines[0]


def test_a_huge_redirected_from_is_dropped_from_the_record(settings, redis_client, site):
    huge = "http://127.0.0.1:9/" + "r" * 2_000_000
    body = WorkMessage(url=site.page_url(1), extra={"redirected_from": huge}).to_json()
    publish_raw(settings, QUEUE, [body])
    with WorkerThread(settings) as _worker:
        assert wait_for(lambda: len(results(redis_client)) == 1, 20)
    record = results(redis_client)[0]
    assert len(json.dumps(record)) <= settings.max_record_bytes
    assert record["redirected_from"] is None and record["redirected_from_truncated"] is True


def test_a_redirected_from_with_a_lone_surrogate_is_recorded_escaped(settings, redis_client,
                                                                     site):
    body = WorkMessage(url=site.page_url(2),
                       extra={"redirected_from": "http://127.0.0.1:9/\ud800"}).to_json()
    publish_raw(settings, QUEUE, [body])
    with WorkerThread(settings) as _worker:
        assert wait_for(lambda: len(results(redis_client)) == 1, 20)
    assert results(redis_client)[0]["redirected_from"] == "http://127.0.0.1:9/\\ud800"
