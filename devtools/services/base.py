"""Plumbing shared by the local servers: loopback checks, the Docker host, context managers.

Free ports, finding the Debian binaries, stopping process groups and ServicesUnavailable live in
:mod:`common.ops.servers` (local mode, ``scrape-fleet up``, uses them without devtools) and are
imported from here as before.
"""

from __future__ import annotations

import ipaddress
import logging
from types import TracebackType
from typing import Self

from common.ops.servers import (  # noqa: F401 - re-exported for devtools.services
    INSTALL_HINT,
    LOOPBACK,
    RABBITMQ_BIN_DIRS,
    REDIS_BIN_DIRS,
    ServicesUnavailable,
    find_binaries,
    free_port,
    tail,
    terminate_group,
)

logger = logging.getLogger(__name__)


def is_loopback_host(host: str | None) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_docker_host() -> str | None:
    """The host testcontainers reaches containers at, when that is loopback (the engine's
    mapped ports on this machine), else None: tests talk to loopback only."""
    from testcontainers.core.docker_client import DockerClient

    client = DockerClient()
    host = client.host()
    if not is_loopback_host(host) or client.get_connection_mode().name != "docker_host":
        logger.debug("not using Docker: containers would be reached at %s", host)
        return None
    return host


class Managed:
    """Context-manager plumbing shared by the local servers: ``with LocalRedis() as r:``."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
