"""How the worker batches acks (common/work/acks.py ``AckLedger.flush``): pure tests on a recording
channel, so each case can say exactly which frames go out. The end-to-end tests (exactly one
result per URL, kill -9, broker restarts) run the same code against RabbitMQ."""

from __future__ import annotations

from common.broker.publisher import Confirm
from common.store.marks import DoneMark
from common.work.acks import AckLedger, Delivery


class RecordingChannel:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, requeue: bool = True) -> None:
        self.frames.append(("nack", tag, False))


def ledger_with(inflight: list[int], marked: list[DoneMark] | None = None
                ) -> tuple[AckLedger, RecordingChannel]:
    sink = marked if marked is not None else []
    ledger = AckLedger(lambda mark, _record: sink.append(mark))
    channel = RecordingChannel()
    ledger.reset(channel)
    for tag in inflight:
        ledger.received(Delivery(tag, "url_queue_ttl", b"{}", 0, False, 0.0))
    return ledger, channel


def test_acks_below_every_unsettled_delivery_go_out_as_one_multiple_ack() -> None:
    ledger, channel = ledger_with([1, 2, 3, 4, 5])
    for tag in (3, 1, 2):
        ledger.ack(tag)
    ledger.flush()
    assert channel.frames == [("ack", 3, True)]


def test_acks_above_a_delivery_still_in_flight_are_sent_one_by_one_not_held() -> None:
    ledger, channel = ledger_with([1, 2, 3, 4, 5, 6])
    for tag in (1, 2, 4, 6):
        ledger.ack(tag)
    ledger.flush()
    # 3 and 5 are still being fetched: 1-2 together, 4 and 6 alone.
    assert channel.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 6, False)]
    assert sorted(ledger.inflight) == [3, 5]
    ledger.flush()
    assert len(channel.frames) == 3, "flushed acks are not sent twice"


def test_a_single_ack_is_not_sent_as_multiple() -> None:
    ledger, channel = ledger_with([7, 8])
    ledger.ack(7)
    ledger.flush()
    assert channel.frames == [("ack", 7, False)]


def test_a_nacked_delivery_below_the_acks_does_not_stop_the_batch() -> None:
    ledger, channel = ledger_with([1, 2, 3])
    ledger.nack(1)  # returned to the broker at once; no longer outstanding
    ledger.ack(2)
    ledger.ack(3)
    ledger.flush()
    assert channel.frames == [("nack", 1, False), ("ack", 3, True)]


def test_with_no_ack_pending_nothing_is_sent() -> None:
    ledger, channel = ledger_with([4])
    ledger.flush()
    assert channel.frames == []


def test_a_delivery_is_acked_only_when_every_publish_of_its_outcome_is_confirmed() -> None:
    marked: list[DoneMark] = []
    ledger, channel = ledger_with([1, 2], marked)
    mark = DoneMark("done:0", 42)
    ledger.expect_confirms(1, mark)
    assert ledger.settle([Confirm((1, 2), True)]) == []
    ledger.flush()
    assert channel.frames == [] and marked == []  # one of two confirms: nothing settled yet
    ledger.settle([Confirm((1, 2), True)])
    ledger.flush()
    assert channel.frames == [("ack", 1, False)] and marked == [mark]
    assert ledger.unsettled  # delivery 2 is still in flight


def test_a_failed_confirm_returns_the_delivery_to_its_queue_without_a_done_mark() -> None:
    marked: list[DoneMark] = []
    ledger, channel = ledger_with([5], marked)
    ledger.expect_confirms(5, DoneMark("done:1", 7))
    assert ledger.settle([Confirm((5, 1), False, "nacked by broker")]) == [5]
    ledger.flush()
    assert channel.frames == [("nack", 5, False)] and marked == []
    assert not ledger.unsettled


def test_a_new_channel_forgets_the_old_channels_tags() -> None:
    ledger, channel = ledger_with([1, 2, 3])
    ledger.ack(1)
    ledger.reset(channel)
    ledger.flush()
    assert channel.frames == [] and not ledger.unsettled
