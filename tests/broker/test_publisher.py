from __future__ import annotations

import pika

from common.broker.publisher import ConfirmingPublisher
from tests.helpers import queue_depth


def test_publishes_are_confirmed_in_bulk_and_persistent(settings, amqp_channel):
    amqp_channel.queue_declare("confirm_test", durable=True)
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        publisher = ConfirmingPublisher(connection)
        for i in range(500):
            publisher.publish("", "confirm_test", b'{"url": "x"}', token=i)
        confirms = publisher.wait(timeout_s=20)
    finally:
        connection.close()
    assert sorted(c.token for c in confirms) == list(range(500))
    assert all(c.ok for c in confirms)
    assert queue_depth(amqp_channel, "confirm_test") == 500
    method, props, _ = amqp_channel.basic_get("confirm_test", auto_ack=True)
    assert props.delivery_mode == 2
    amqp_channel.queue_delete("confirm_test")


def test_an_unroutable_publish_is_reported_as_failed(settings):
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        publisher = ConfirmingPublisher(connection)
        publisher.publish("", "no_such_queue_anywhere", b"{}", token="lost")
        confirms = publisher.wait(timeout_s=10)
    finally:
        connection.close()
    assert [(c.token, c.ok, c.reason) for c in confirms] == [("lost", False, "unroutable")]
