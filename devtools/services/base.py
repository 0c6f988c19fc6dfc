"""Plumbing shared by the local servers: free ports, finding the binaries, stopping children.

The server binaries come from Debian's ``rabbitmq-server`` and ``redis-server`` packages
(``scripts/bootstrap.sh`` installs them); :func:`find_binaries` locates them and says how to
install them when they are missing.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
INSTALL_HINT = (
    "install them with `apt-get install -y rabbitmq-server redis-server` "
    "(or run scripts/bootstrap.sh)"
)
#: Where Debian keeps the real RabbitMQ scripts. /usr/sbin/rabbitmq-server is a wrapper that
#: switches to the rabbitmq user and drops the environment, so it cannot be used here.
RABBITMQ_BIN_DIRS: tuple[str, ...] = ("/usr/lib/rabbitmq/bin",)
REDIS_BIN_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/local/bin")


class ServicesUnavailable(RuntimeError):
    """RabbitMQ or Redis could not be found or started."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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

def _find_executable(name: str, dirs: Iterable[str]) -> str | None:
    for directory in dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    # Debian's /usr/sbin/rabbitmq-* are a wrapper that drops our environment variables.
    if found and Path(found).resolve().name != "rabbitmq-script-wrapper":
        return found
    return None


def find_binaries(services: Iterable[str] = ("rabbitmq", "redis")) -> dict[str, str]:
    """Locate the server binaries needed to run ``services`` locally.

    Args:
        services: any of ``"rabbitmq"`` and ``"redis"``.

    Returns:
        Paths keyed by ``"rabbitmq-server"``, ``"rabbitmqctl"`` and/or ``"redis-server"``.

    Raises:
        ServicesUnavailable: naming the missing binaries and how to install them.
    """
    wanted: dict[str, tuple[str, ...]] = {}
    for service in services:
        if service == "rabbitmq":
            wanted["rabbitmq-server"] = RABBITMQ_BIN_DIRS
            wanted["rabbitmqctl"] = RABBITMQ_BIN_DIRS
        elif service == "redis":
            wanted["redis-server"] = REDIS_BIN_DIRS
        else:
            raise ValueError(f"unknown service {service!r}")
    found: dict[str, str] = {}
    missing: list[str] = []
    for name, dirs in wanted.items():
        path = _find_executable(name, dirs)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        raise ServicesUnavailable(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    return found


def tail(path: Path, max_lines: int = 30) -> str:
    """The last ``max_lines`` lines of a log file, for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not readable)"
    return "\n".join(lines[-max_lines:])


def terminate_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it is still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("process group %d ignored %s", proc.pid, sig.name)
    # Reap any straggler in the group (the child itself may be gone already).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError) as exc:
        logger.debug("process group %d already gone (%s)", proc.pid, type(exc).__name__)
    if proc.poll() is None:
        proc.wait(timeout=timeout_s)


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
