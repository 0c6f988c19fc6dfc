"""RabbitMQ and Redis run from Debian's binaries on loopback: finding them, ports, starting Redis,
stopping process groups. Shared by local mode (``scrape-fleet up``) and the test tooling.

The binaries come from Debian's ``rabbitmq-server`` and ``redis-server`` packages
(``scripts/bootstrap.sh`` installs them); :func:`find_binaries` locates them and says how to
install them when they are missing. The RabbitMQ node itself is :mod:`common.ops.rabbit_node`.
A server runs in the foreground in its own process group (``start_new_session``), so stopping
the group leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import redis
import redis.exceptions

from common.core.errors import ServiceUnavailable
from common.ops.fleet_dir import write_private

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


class ServicesUnavailable(ServiceUnavailable, RuntimeError):
    """RabbitMQ or Redis could not be found or started (a RuntimeError for the test tooling,
    a ServiceUnavailable for the entry scripts' exit code 3)."""


#: How many ports below the kernel's ephemeral range :func:`free_port` draws from.
STABLE_PORTS = 12_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now, drawn from below the kernel's ephemeral
    range: a server stopped and started again on its port (a broker or Redis restart) cannot
    find it taken by the local port of some outgoing connection, which the kernel draws from
    that range (a fresh-clone run's ``rabbitmqctl start_app`` failed with eaddrinuse). The
    kernel's pick when that range cannot be read or no drawn port is free."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - STABLE_PORTS >= 1024:
        draw = random.Random()
        for _ in range(50):
            port = draw.randrange(low - STABLE_PORTS, low)
            if port_is_free(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when a server could listen on ``host:port`` now (as servers do, with SO_REUSEADDR:
    connections of an earlier run in TIME_WAIT do not hold the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int | None, taken: Iterable[int] = (), host: str = LOOPBACK) -> int:
    """``preferred`` when it is free (and not in ``taken``), else a free port."""
    if preferred and preferred not in taken and port_is_free(preferred, host):
        return preferred
    while (port := free_port(host)) in taken:
        pass
    return port


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


def redis_command(binary: str, *, port: int, directory: Path, appendonly: bool,
                  password: str | None = None, extra_args: Sequence[str] = (),
                  host: str = LOOPBACK) -> list[str]:
    """``redis-server`` in the foreground on ``host:port``, its files in ``directory``: no RDB
    save points (a clean shutdown may still SAVE), an AOF when ``appendonly``, then
    ``extra_args`` (``--option value`` pairs).

    A ``password`` is never on the command line (``/proc/PID/cmdline`` is readable by every
    local user until Redis rewrites it): it goes into ``directory/auth.conf``, written mode
    0600 here, whose path is the server's first argument (its config file).
    """
    cmd = [binary]
    if password:
        cmd.append(str(write_private(directory / AUTH_CONF,
                                     f"requirepass {redis_config_string(password)}\n")))
    cmd += ["--port", str(port), "--bind", host, "--dir", str(directory),
            "--save", "", "--appendonly", "yes" if appendonly else "no",
            "--daemonize", "no", "--logfile", str(directory / "redis.log")]
    cmd += extra_args
    return cmd


#: Redis's password file in its directory (:func:`redis_command`).
AUTH_CONF = "auth.conf"


def redis_config_string(value: str) -> str:
    """``value`` as one double-quoted argument of a Redis config file: every byte but letters
    and digits as ``\\xHH``, so no character of a password can end or split it."""
    return '"' + "".join(chr(b) if chr(b).isascii() and chr(b).isalnum() else f"\\x{b:02x}"
                         for b in value.encode()) + '"'


def start_redis(cmd: list[str], client: redis.Redis, timeout_s: float) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (from :func:`redis_command`) in its own process group and wait until
    ``client`` gets an answer to PING (an AOF being replayed answers LOADING: keep waiting).

    Raises:
        ServicesUnavailable: the server exited or did not answer within ``timeout_s``; it is
            stopped again.
    """
    log_path = Path(cmd[cmd.index("--dir") + 1]) / "redis.log"
    logger.debug("starting redis: %s", " ".join(cmd))  # no secret: see redis_command
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise ServicesUnavailable(
                    f"redis-server exited with {proc.returncode}:\n{tail(log_path)}")
            try:
                client.ping()
                return proc
            except redis.exceptions.BusyLoadingError:
                pass  # replaying the AOF after a restart
            except redis.exceptions.ConnectionError as exc:
                if time.monotonic() > deadline:
                    raise ServicesUnavailable(
                        f"redis-server did not answer within {timeout_s} s: {exc}\n"
                        f"{tail(log_path)}") from None
            time.sleep(0.05)
    except BaseException:
        terminate_group(proc, timeout_s=10)
        raise
