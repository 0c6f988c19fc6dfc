"""The AMQP connection every process uses: any live node of the broker's addresses, retried
with the reconnect policy.

RABBITMQ_URLS (or a comma-separated RABBITMQ_URL) names a cluster's nodes. Each connect tries
them in a fresh random order (pika's BlockingConnection takes a list of parameters and moves on
to the next address when one refuses), so a fleet spreads over the nodes and a process whose
node died reconnects to a live one: the worker's session loop and the producer call
:func:`connect_rabbitmq` again after a lost connection.

:func:`connect_rabbitmq` fails with :class:`ServiceUnavailable` once
``settings.connect_retry_s`` has passed, so an entry script can print one clear line and exit
non-zero; with CONNECT_RETRY_S=inf (compose and Swarm's long-running services: Swarm starts
them in any order) it waits as long as it takes, logging "waiting for RabbitMQ at HOST:PORT"
every 10 s. Authentication failures and bad vhosts are never retried: retrying them only delays
the operator's fix.
"""

from __future__ import annotations

import logging
import random
import threading

import pika
import pika.exceptions

from common.broker import topology
from common.broker.publisher import ConfirmingPublisher
from common.core.backoff import keep_trying
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, ServiceUnavailable

logger = logging.getLogger(__name__)

_RETRYABLE = (*AMQP_CONNECTION_LOST, OSError)
_FATAL = (pika.exceptions.ProbableAuthenticationError,
          pika.exceptions.ProbableAccessDeniedError)


def amqp_parameters(settings: Settings, url: str | None = None) -> pika.URLParameters:
    """pika parameters for ``url`` (default: the first address) with our timeouts."""
    params = pika.URLParameters(url or settings.rabbitmq_url)
    params.heartbeat = settings.rabbitmq_heartbeat_s
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    params.socket_timeout = 10
    params.client_properties = {"connection_name": f"scrape-fleet {settings.worker_id}"}
    return params


def address_list(settings: Settings) -> list[pika.URLParameters]:
    """Parameters for every broker address, in a fresh random order."""
    urls = list(settings.rabbitmq_urls)
    random.shuffle(urls)
    return [amqp_parameters(settings, url) for url in urls]


def _where(params: pika.URLParameters) -> str:
    return f"{params.host}:{params.port}{params.virtual_host}"


def connect_rabbitmq(settings: Settings,
                     stop: threading.Event | None = None) -> pika.BlockingConnection:
    """A BlockingConnection to a live node, retried with backoff (CONNECT_RETRY_S).

    Args:
        stop: ends the wait at once when set (a worker asked to stop).

    Raises:
        ServiceUnavailable: the broker refused our credentials, no node became reachable, or
            ``stop`` was set.
    """
    where = ", ".join(_where(amqp_parameters(settings, url)) for url in settings.rabbitmq_urls)

    def connect() -> pika.BlockingConnection:
        addresses = address_list(settings)
        try:
            connection = pika.BlockingConnection(addresses)
        except _FATAL as exc:
            raise ServiceUnavailable(
                f"RabbitMQ at {where} refused the login ({type(exc).__name__}); "
                "check RABBITMQ_USER/RABBITMQ_PASSWORD/RABBITMQ_VHOST") from None
        if len(addresses) > 1:
            logger.info("connected to RabbitMQ node %s", _where(connection._impl.params))
        return connection

    return keep_trying(connect, timeout_s=settings.connect_retry_s, retry_on=_RETRYABLE,
                       service="RabbitMQ", where=where, stop=stop)


def open_publisher(settings: Settings) -> tuple[pika.BlockingConnection, ConfirmingPublisher]:
    """A connection to a live node with the topology declared (QUEUE_TYPE) and a confirming
    publisher on it: what every process that publishes URLs opens first."""
    connection = connect_rabbitmq(settings)
    topology.declare(connection.channel(), settings.queue_type)
    return connection, ConfirmingPublisher(connection)
