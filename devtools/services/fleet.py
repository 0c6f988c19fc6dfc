"""Where the fleet's RabbitMQ and Redis come from: the environment, Docker or local binaries.

:func:`fleet_services` tries, for each service independently:

1. ``RABBITMQ_URL`` / ``REDIS_URL`` from the environment, used as-is.
2. Docker containers through testcontainers, only when a *local* Docker engine answers and
   the containers are reached over loopback.
3. The Debian binaries, as :class:`~devtools.services.rabbitmq_server.LocalRabbitMQ` and
   :class:`~devtools.services.redis_server.LocalRedis`.

:func:`reset_state` empties both between tests and benchmark phases.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import pika
import pika.exceptions
import redis
import redis.exceptions

from common.core.redact import redact_url
from devtools.services.base import find_binaries, is_loopback_host, loopback_docker_host
from devtools.services.rabbitmq_server import LocalRabbitMQ
from devtools.services.redis_server import LocalRedis

logger = logging.getLogger(__name__)

RABBITMQ_IMAGE = "rabbitmq:3.13-management"
REDIS_IMAGE = "redis:7-alpine"
DOCKER_PING_TIMEOUT_S = 3


@dataclass
class FleetServices:
    """What :func:`fleet_services` yields.

    Attributes:
        rabbitmq_url: AMQP URL of the broker.
        redis_url: Redis URL.
        rabbitmq: the local node when one was started here, else None.
        redis: the local Redis when one was started here, else None.
        management_url: management API base URL, when known.
        management_auth: (user, password) for the management API, when known.
        sources: where each service came from: ``"env"``, ``"docker"`` or ``"local"``.
    """

    rabbitmq_url: str
    redis_url: str
    rabbitmq: LocalRabbitMQ | None = None
    redis: LocalRedis | None = None
    management_url: str | None = None
    management_auth: tuple[str, str] | None = None
    sources: dict[str, str] = field(default_factory=dict)


def _docker_engine_answers(env: Mapping[str, str]) -> bool:
    """True when a Docker engine on this machine answers a ping within a few seconds."""
    docker_host = env.get("DOCKER_HOST", "")
    if docker_host and not docker_host.startswith("unix://"):
        host = urlsplit(docker_host).hostname
        if not is_loopback_host(host):
            logger.debug("not using Docker: DOCKER_HOST=%s is not local", docker_host)
            return False
    try:
        import docker
        import docker.errors
        import requests.exceptions
    except ImportError as exc:
        logger.debug("not using Docker: %s", exc)
        return False
    try:
        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S, environment=dict(env))
    except docker.errors.DockerException as exc:
        logger.debug("not using Docker: no client: %s", exc)
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        logger.debug("not using Docker: engine does not answer: %s", exc)
        return False
    finally:
        client.close()


def _start_containers(stack: ExitStack, want_rabbitmq: bool, want_redis: bool,
                      result: FleetServices) -> bool:
    """Start the wanted containers; False (and nothing left running) when that fails."""
    try:
        import docker.errors
        import requests.exceptions
        from testcontainers.core.exceptions import ContainerStartException

        try:
            from testcontainers.community.rabbitmq import RabbitMqContainer
            from testcontainers.community.redis import RedisContainer
        except ImportError:  # testcontainers < 4.14
            from testcontainers.rabbitmq import RabbitMqContainer
            from testcontainers.redis import RedisContainer
    except ImportError as exc:
        logger.debug("not using Docker: %s", exc)
        return False

    host = loopback_docker_host()
    if host is None:
        return False

    errors = (docker.errors.DockerException, requests.exceptions.RequestException,
              ContainerStartException, pika.exceptions.AMQPError, redis.exceptions.RedisError,
              TimeoutError, OSError)
    containers = ExitStack()
    try:
        if want_rabbitmq:
            user, password = "fleet", secrets.token_urlsafe(18)
            rabbit = RabbitMqContainer(RABBITMQ_IMAGE, username=user, password=password)
            rabbit.with_exposed_ports(15672)
            rabbit.start()
            containers.callback(rabbit.stop)
            port = rabbit.get_exposed_port(rabbit.port)
            result.rabbitmq_url = f"amqp://{user}:{quote(password, safe='')}@{host}:{port}/%2F"
            result.management_url = f"http://{host}:{rabbit.get_exposed_port(15672)}"
            result.management_auth = (user, password)
            result.sources["rabbitmq"] = "docker"
        if want_redis:
            redis_container = RedisContainer(REDIS_IMAGE)
            redis_container.start()
            containers.callback(redis_container.stop)
            port = redis_container.get_exposed_port(redis_container.port)
            result.redis_url = f"redis://{host}:{port}/0"
            result.sources["redis"] = "docker"
    except errors as exc:
        logger.warning("Docker answered but the containers did not start (%s); "
                       "falling back to local binaries", exc)
        containers.close()
        for name in ("rabbitmq", "redis"):
            if result.sources.get(name) == "docker":
                del result.sources[name]
        return False
    stack.enter_context(containers)
    return True


@contextmanager
def fleet_services(env: Mapping[str, str] | None = None) -> Iterator[FleetServices]:
    """RabbitMQ and Redis for tests or the demo, stopped again on exit.

    Args:
        env: where to read ``RABBITMQ_URL`` / ``REDIS_URL`` / ``DOCKER_HOST``
            (default: ``os.environ``).

    Yields:
        A :class:`FleetServices` with both URLs.

    Raises:
        ServicesUnavailable: (a RuntimeError) when neither Docker nor the local binaries work.
    """
    source = os.environ if env is None else env
    result = FleetServices(rabbitmq_url=source.get("RABBITMQ_URL", ""),
                           redis_url=source.get("REDIS_URL", ""))
    if result.rabbitmq_url:
        result.sources["rabbitmq"] = "env"
        result.management_url = source.get("RABBITMQ_MANAGEMENT_URL") or None
    if result.redis_url:
        result.sources["redis"] = "env"

    with ExitStack() as stack:
        want_rabbitmq, want_redis = not result.rabbitmq_url, not result.redis_url
        if ((want_rabbitmq or want_redis) and _docker_engine_answers(source)
                and _start_containers(stack, want_rabbitmq, want_redis, result)):
            want_rabbitmq = want_redis = False
        if want_rabbitmq or want_redis:
            needed = [name for name, want in (("rabbitmq", want_rabbitmq), ("redis", want_redis))
                      if want]
            binaries = find_binaries(needed)
            if want_redis:
                result.redis = stack.enter_context(LocalRedis(binary=binaries["redis-server"]))
                result.redis_url = result.redis.url
                result.sources["redis"] = "local"
            if want_rabbitmq:
                result.rabbitmq = stack.enter_context(LocalRabbitMQ(binaries=binaries))
                result.rabbitmq_url = result.rabbitmq.url
                result.management_url = result.rabbitmq.management_url
                result.management_auth = result.rabbitmq.management_auth
                result.sources["rabbitmq"] = "local"
        logger.info("services: rabbitmq=%s (%s), redis=%s (%s)",
                    redact_url(result.rabbitmq_url), result.sources["rabbitmq"],
                    redact_url(result.redis_url), result.sources["redis"])
        yield result


def reset_state(rabbitmq_url: str, redis_url: str, *, all_databases: bool = False,
                purge: bool = False) -> None:
    """Empty the fleet's state: flush Redis (its database, or all with ``all_databases``) and
    delete and re-declare every queue and exchange of the topology.

    ``purge`` (the tests' fixture): when every queue and exchange of the topology exists and no
    queue has a consumer, purge the queues instead (about 10 ms against 140 ms: declaring
    durable queues is a disk write each). Anything else — a queue or exchange missing, a
    consumer left over from an earlier test — gets the full delete and re-declare."""
    from common.broker import topology

    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall() if all_databases else client.flushdb()
    finally:
        client.close()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        if purge and _purged(channel, topology):
            return
        if channel.is_closed:
            channel = connection.channel()
        topology.delete_all(channel)
        topology.declare(channel)
    finally:
        connection.close()


def _purged(channel: Any, topology: Any) -> bool:
    """Purge every topology queue if all exist unconsumed (False: nothing was purged, or the
    channel was closed by a missing one)."""
    try:
        for exchange in topology.EXCHANGES:
            channel.exchange_declare(exchange.name, passive=True)
        counts: dict[str, int] = {}
        for queue in topology.QUEUES:
            ok = channel.queue_declare(queue.name, passive=True)
            if ok.method.consumer_count:
                return False
            counts[queue.name] = ok.method.message_count
    except pika.exceptions.ChannelClosedByBroker as exc:
        logger.debug("topology incomplete (%s): declaring it again", exc)
        return False
    for name, count in counts.items():
        if count:
            channel.queue_purge(name)
    return True
