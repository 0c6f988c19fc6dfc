"""The AMQP connection every process uses, retried with the reconnect policy.

:func:`connect_rabbitmq` fails fast with :class:`ServiceUnavailable` once
``settings.connect_retry_s`` has passed, so an entry script can print one clear line and exit
non-zero. Authentication failures and bad vhosts are never retried: retrying them only delays
the operator's fix.
"""

from __future__ import annotations

import pika
import pika.exceptions

from common.core.backoff import keep_trying
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, ServiceUnavailable

_RETRYABLE = (*AMQP_CONNECTION_LOST, OSError)
_FATAL = (pika.exceptions.ProbableAuthenticationError,
          pika.exceptions.ProbableAccessDeniedError)


def amqp_parameters(settings: Settings) -> pika.URLParameters:
    params = pika.URLParameters(settings.rabbitmq_url)
    params.heartbeat = settings.rabbitmq_heartbeat_s
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    params.socket_timeout = 10
    params.client_properties = {"connection_name": f"scrape-fleet {settings.worker_id}"}
    return params


def connect_rabbitmq(settings: Settings) -> pika.BlockingConnection:
    """A BlockingConnection to the broker, retried with backoff.

    Raises:
        ServiceUnavailable: the broker refused our credentials or stayed unreachable.
    """
    params = amqp_parameters(settings)
    where = f"{params.host}:{params.port}{params.virtual_host}"

    def connect() -> pika.BlockingConnection:
        try:
            return pika.BlockingConnection(params)
        except _FATAL as exc:
            raise ServiceUnavailable(
                f"RabbitMQ at {where} refused the login ({type(exc).__name__}); "
                "check RABBITMQ_USER/RABBITMQ_PASSWORD/RABBITMQ_VHOST") from None

    return keep_trying(connect, timeout_s=settings.connect_retry_s, retry_on=_RETRYABLE,
                       service="RabbitMQ", where=where)
