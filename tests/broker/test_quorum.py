"""QUEUE_TYPE=quorum on the real broker (the session's RabbitMQ: a quorum queue needs no
cluster), in a virtual host of its own so the other tests' classic topology is untouched:
the declared arguments, the migration message for a classic broker, a given-back delivery
that does not count toward the delivery limit, and a list of addresses with a dead one."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pytest
import requests

from common.broker import topology
from common.broker.connection import connect_rabbitmq
from common.broker.publisher import ConfirmingPublisher
from common.core.config import Settings, load_settings
from common.core.errors import TopologyMismatch
from common.ops.stats import _management
from common.work.acks import AckLedger, Delivery
from devtools.services import FleetServices
from devtools.services.base import free_port
from tests.helpers import TEST_ENV


def _api(services: FleetServices, method: str, path: str, **kwargs: Any) -> requests.Response:
    response = requests.request(method, f"{services.management_url}/api/{path}",
                                auth=services.management_auth, timeout=10, **kwargs)
    response.raise_for_status()
    return response


@pytest.fixture
def vhost(services: FleetServices) -> Iterator[str]:
    """A fresh virtual host, the session broker's user allowed everything in it."""
    if not services.management_url or not services.management_auth:
        pytest.skip("the broker's management API is unknown here")
    name = f"qq-{secrets.token_hex(4)}"
    _api(services, "PUT", f"vhosts/{name}")
    _api(services, "PUT", f"permissions/{name}/{quote(services.management_auth[0], safe='')}",
         json={"configure": ".*", "write": ".*", "read": ".*"})
    try:
        yield name
    finally:
        _api(services, "DELETE", f"vhosts/{name}")


def _url_in(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


def _settings(services: FleetServices, vhost: str, **env: str) -> Settings:
    return load_settings({**TEST_ENV, "REDIS_URL": services.redis_url,
                          "RABBITMQ_URL": _url_in(services.rabbitmq_url, vhost), **env})


def test_quorum_mode_declares_every_queue_replicated_with_at_least_once_dead_lettering(
        services, vhost):
    settings = _settings(services, vhost, QUEUE_TYPE="quorum")
    connection = connect_rabbitmq(settings)
    try:
        topology.declare(connection.channel(), settings.queue_type)
        topology.declare(connection.channel(), settings.queue_type)  # idempotent
    finally:
        connection.close()
    declared = {q["name"]: q for q in _api(services, "GET", f"queues/{vhost}").json()}
    assert set(declared) == {q.name for q in topology.QUEUES}
    assert {q["type"] for q in declared.values()} == {"quorum"}
    work = declared[topology.NORMAL_QUEUE]["arguments"]
    assert work["x-dead-letter-strategy"] == "at-least-once"
    assert work["x-overflow"] == "reject-publish"
    assert work["x-delivery-limit"] == topology.DELIVERY_LIMIT
    assert work["x-message-ttl"] == topology.QUEUE_TTL_MS[topology.NORMAL_QUEUE]
    hold = declared[topology.hold_name(100)]["arguments"]
    assert hold["x-dead-letter-strategy"] == "at-least-once" and "x-delivery-limit" not in hold
    dead = declared[topology.FAILED_QUEUE]["arguments"]
    assert dead["x-delivery-limit"] == topology.BROWSE_DELIVERY_LIMIT
    assert "x-max-priority" not in str(declared)


def test_a_classic_broker_asked_for_quorum_queues_says_how_to_migrate(services, vhost, run_cli):
    classic = _settings(services, vhost)
    connection = connect_rabbitmq(classic)
    try:
        topology.declare(connection.channel())
        with pytest.raises(TopologyMismatch) as caught:
            topology.declare(connection.channel(), topology.QUORUM)
    finally:
        connection.close()
    message = str(caught.value)
    assert "QUEUE_TYPE=quorum" in message and "PRECONDITION_FAILED" in message
    assert "virtual host" in message and "NOTES.md" in message

    # The entry scripts print it as a configuration error (exit 2), not a traceback.
    result = run_cli("stats.py", env={"RABBITMQ_URL": classic.rabbitmq_url,
                                      "QUEUE_TYPE": "quorum"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("configuration error: RabbitMQ refused to declare queue")
    assert "Traceback" not in result.stderr


def _one_delivery(channel: Any, queue: str, timeout_s: float = 10) -> tuple[Any, Any, bytes]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, props, body = channel.basic_get(queue)
        if method is not None:
            return method, props, body
        time.sleep(0.05)
    raise AssertionError(f"no message in {queue}")


def test_a_delivery_given_back_is_a_fresh_copy_not_a_requeue_counted_by_the_delivery_limit(
        services, vhost):
    settings = _settings(services, vhost, QUEUE_TYPE="quorum")
    queue = topology.NORMAL_QUEUE
    connection = connect_rabbitmq(settings)
    try:
        topology.declare(connection.channel(), topology.QUORUM)
        channel = connection.channel()
        channel.basic_publish("", queue, b'{"url": "https://a.example/"}',
                              pika.BasicProperties(delivery_mode=2, expiration="600000"))
        # A requeue (basic.nack) counts: x-delivery-count 1 on the next delivery.
        method, _props, _body = _one_delivery(channel, queue)
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, props, body = _one_delivery(channel, queue)
        assert props.headers["x-delivery-count"] == 1
        # Given back by the worker's ledger: a confirmed copy, then an ack of the original.
        ledger = AckLedger(lambda _mark, _record: None)
        publisher = ConfirmingPublisher(connection)
        ledger.reset(channel._impl, publisher)
        delivery = Delivery(method.delivery_tag, queue, body, 1, False, time.monotonic(),
                            expiration_ms=600000)
        ledger.received(delivery)
        ledger.give_back(delivery)
        deadline = time.monotonic() + 10
        while ledger.unsettled and time.monotonic() < deadline:
            assert ledger.settle(publisher.poll(0.05)) == []
            ledger.flush()
        assert not ledger.unsettled
        connection.process_data_events(time_limit=0.2)
        method, props, again = _one_delivery(channel, queue)
        assert again == body and not method.redelivered
        assert (props.headers or {}).get("x-delivery-count", 0) == 0
        assert props.expiration == "600000"
        channel.basic_ack(method.delivery_tag)
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        connection.close()


def test_a_list_of_broker_addresses_connects_past_a_dead_one(services, vhost):
    live = _url_in(services.rabbitmq_url, vhost)
    dead = urlsplit(live)._replace(netloc=f"{urlsplit(live).netloc.rsplit(':', 1)[0]}:"
                                          f"{free_port()}")
    settings = load_settings({"RABBITMQ_URLS": f"{urlunsplit(dead)}, {live}",
                              "CONNECT_RETRY_S": "5"})
    assert settings.rabbitmq_urls == (urlunsplit(dead), live)
    for _ in range(4):  # random order each time: dead first or second, it connects
        connection = connect_rabbitmq(settings)
        assert connection.is_open and connection._impl.params.port == urlsplit(live).port
        connection.close()


def test_a_list_of_urls_is_shown_with_every_password_masked():
    secret_a, secret_b = "S3cr3t-qq-one", "S3cr3t-qq-two"
    settings = load_settings({"RABBITMQ_URLS": f"amqp://u:{secret_a}@a:5672/%2F,"
                                               f"amqp://u:{secret_b}@b:5672/%2F"})
    shown = repr(settings)
    assert "rabbitmq_urls_raw='amqp://u:***@a:5672/%2F,amqp://u:***@b:5672/%2F'" in shown
    assert "S3cr3t" not in shown
    assert {secret_a, secret_b} <= settings.secrets()
    assert settings.rabbitmq_url == f"amqp://u:{secret_a}@a:5672/%2F"


def test_the_status_view_takes_the_first_management_api_that_answers(services):
    if not services.management_url or not services.management_auth:
        pytest.skip("the broker's management API is unknown here")
    user, password = services.management_auth
    live = urlsplit(services.management_url)
    creds = f"{quote(user, safe='')}:{quote(password, safe='')}"
    dead = f"http://{creds}@127.0.0.1:{free_port()}"
    settings = load_settings({"RABBITMQ_URL": services.rabbitmq_url,
                              "RABBITMQ_MANAGEMENT_URL": f"{dead},http://{creds}@{live.netloc}"})
    assert _management(settings) == (f"http://{live.hostname}:{live.port}", (user, password))
    other = f"http://{creds}@127.0.0.1:{free_port()}"
    settings = load_settings({"RABBITMQ_URL": services.rabbitmq_url,
                              "RABBITMQ_MANAGEMENT_URL": f"{dead},{other}"})
    assert _management(settings) is None
