"""A service started before RabbitMQ or Redis waits for them, says so, and connects.

Swarm ignores depends_on and starts every service at once; compose and Swarm give the worker,
sink and scheduler CONNECT_RETRY_S=inf (tests/test_compose_env.py). Real services: the session
broker stopped and started again (its application, as tests/test_faults.py does), a Redis
started on the port a client was already waiting for. A worker asked to stop while waiting
stops at once instead of waiting out its stop_grace_period.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from common.core.config import Settings, load_settings
from common.store.connection import connect_redis
from devtools.services import FleetServices
from devtools.services.rabbitmq_server import LocalRabbitMQ
from devtools.services.redis_server import LocalRedis
from tests.helpers import output_of, start_worker_process, wait_for

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _broker_down(services: FleetServices) -> Iterator[LocalRabbitMQ]:
    if services.rabbitmq is None:
        pytest.skip("the broker was not started by these tests, so it cannot be stopped")
    services.rabbitmq.stop_app()
    try:
        yield services.rabbitmq
    finally:
        services.rabbitmq.start_app()  # idempotent once the test started it


def test_a_client_started_before_redis_waits_and_connects_when_it_comes(caplog):
    port = _free_port()
    settings = load_settings({"REDIS_URL": f"redis://127.0.0.1:{port}/0",
                              "CONNECT_RETRY_S": "inf"})
    got: dict[str, Any] = {}
    waiting = threading.Thread(target=lambda: got.update(client=connect_redis(settings)),
                               daemon=True)
    with caplog.at_level(logging.WARNING, logger="common.core.backoff"):
        waiting.start()
        time.sleep(3)
        assert waiting.is_alive(), "gave up instead of waiting"
        with LocalRedis(port=port) as redis_server:
            waiting.join(timeout=30)
            assert not waiting.is_alive(), "did not connect once Redis was up"
            assert got["client"].ping()
            assert redis_server.port == port
    said = [r.getMessage() for r in caplog.records]
    assert any(f"waiting for Redis at 127.0.0.1:{port}" in m and "no time limit" in m
               for m in said), said


def test_a_worker_started_before_its_broker_waits_then_consumes(services, settings: Settings):
    with _broker_down(services) as broker:
        worker = start_worker_process(settings, "--idle-exit", "2",
                                      env={"CONNECT_RETRY_S": "inf"})
        try:
            assert wait_for(lambda: "waiting for RabbitMQ at" in output_of(worker),
                            timeout_s=30), output_of(worker)[-2000:]
            time.sleep(2)
            assert worker.poll() is None, output_of(worker)[-2000:]  # exit 3 before
            broker.start_app()
            assert worker.wait(timeout=90) == 0, output_of(worker)[-3000:]
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)
    out = output_of(worker)
    assert "no time limit (CONNECT_RETRY_S)" in out
    assert "consuming" in out and out.index("waiting for RabbitMQ") < out.index("consuming")


def test_a_worker_waiting_for_its_broker_stops_at_once_when_asked(settings: Settings):
    closed = f"amqp://guest:guest@127.0.0.1:{_free_port()}/%2F"
    worker = start_worker_process(settings, env={"CONNECT_RETRY_S": "inf",
                                                 "RABBITMQ_URL": closed})
    try:
        assert wait_for(lambda: "waiting for RabbitMQ at" in output_of(worker),
                        timeout_s=30), output_of(worker)[-2000:]
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=10) == 0, output_of(worker)[-2000:]
        assert time.monotonic() - started < 5
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    assert "Traceback" not in output_of(worker)
