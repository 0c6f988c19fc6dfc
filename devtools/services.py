"""Real RabbitMQ and Redis servers for tests and the local demo, started on loopback only.

Three ways to get the services, tried in this order by :func:`fleet_services`:

1. ``RABBITMQ_URL`` / ``REDIS_URL`` from the environment, used as-is (each independently).
2. Docker containers through testcontainers, only when a *local* Docker engine answers.
3. The Debian ``rabbitmq-server`` / ``redis-server`` binaries, run as child processes on free
   127.0.0.1 ports, each in its own temporary directory (see shared/LOCAL-SERVICES.md).

A local RabbitMQ node takes 5-20 s to start, so tests start it once per session.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlsplit

import pika
import pika.exceptions
import redis
import redis.exceptions

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
RABBITMQ_IMAGE = "rabbitmq:3.13-management"
REDIS_IMAGE = "redis:7-alpine"
DOCKER_PING_TIMEOUT_S = 3


class ServicesUnavailable(RuntimeError):
    """RabbitMQ or Redis could not be found or started."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def _tail(path: Path, max_lines: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not readable)"
    return "\n".join(lines[-max_lines:])


def _terminate_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
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
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=timeout_s)


class _Managed:
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


class LocalRedis(_Managed):
    """A ``redis-server`` child process on a free 127.0.0.1 port, in its own temp dir.

    Args:
        appendonly: keep an AOF in the temp dir so data survives :meth:`restart`.
        port: TCP port (default: a free one).
        binary: path to ``redis-server`` (default: found with :func:`find_binaries`).
        start_timeout_s: how long :meth:`start` waits for PING to answer.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        binary: str | None = None,
        start_timeout_s: float = 15.0,
    ) -> None:
        self.appendonly = appendonly
        self.port = port or free_port()
        self.host = LOOPBACK
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRedis:
        """Start the server and wait until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis on port {self.port} is already running")
        if self.binary is None:
            self.binary = find_binaries(["redis"])["redis-server"]
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="fleet-redis-"))
        log_path = self.dir / "redis.log"
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no",
            "--logfile", str(log_path),
        ]
        logger.debug("starting redis: %s", " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=1,
                             socket_connect_timeout=1)
        try:
            while True:
                if self._proc.poll() is not None:
                    raise ServicesUnavailable(
                        f"redis-server exited with {self._proc.returncode}:\n{_tail(log_path)}")
                try:
                    client.ping()
                    break
                except redis.exceptions.BusyLoadingError:
                    pass  # replaying the AOF after a restart
                except redis.exceptions.ConnectionError as exc:
                    if time.monotonic() > deadline:
                        self._kill()
                        raise ServicesUnavailable(
                            f"redis-server did not answer within {self.start_timeout_s} s: "
                            f"{exc}\n{_tail(log_path)}") from None
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()
        logger.info("redis started at %s (dir %s)", self.url, self.dir)
        return self

    def _kill(self, hard: bool = False) -> None:
        if self._proc is None:
            return
        if hard and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=10)
        _terminate_group(self._proc, timeout_s=10)
        self._proc = None

    def restart(self, *, kill: bool = False) -> LocalRedis:
        """Stop and start again on the same port and directory.

        Args:
            kill: SIGKILL instead of a clean shutdown (simulates a crash; with
                ``appendonly`` the last second of writes may be lost, as in production).
        """
        self._kill(hard=kill)
        return self.start()

    def stop(self) -> None:
        """Shut the server down and delete its directory. Safe to call twice."""
        self._kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class LocalRabbitMQ(_Managed):
    """A RabbitMQ node with the management plugin on free 127.0.0.1 ports, in a temp dir.

    The node gets its own name, data dir, log dir, Erlang cookie (HOME) and distribution
    port, so several can run side by side. Its only user has a random name and password,
    created by the broker on first boot (``default_user``/``default_pass``).

    Args:
        binaries: paths from :func:`find_binaries` (default: looked up).
        start_timeout_s: upper bound for ``rabbitmqctl wait``.
    """

    def __init__(self, *, binaries: Mapping[str, str] | None = None,
                 start_timeout_s: float = 90.0) -> None:
        self.host = LOOPBACK
        self.binaries = dict(binaries) if binaries else None
        self.start_timeout_s = start_timeout_s
        suffix = secrets.token_hex(4)
        self.nodename = f"rabbit-{suffix}@localhost"
        self.username = f"fleet-{suffix}"
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.management_port = 0
        self.dist_port = 0
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``amqp://USER:PASS@127.0.0.1:PORT/%2F``."""
        return (f"amqp://{quote(self.username, safe='')}:{quote(self.password, safe='')}"
                f"@{self.host}:{self.port}/%2F")

    @property
    def management_url(self) -> str:
        """``http://127.0.0.1:PORT`` (basic auth: :attr:`username` / :attr:`password`)."""
        return f"http://{self.host}:{self.management_port}"

    @property
    def management_auth(self) -> tuple[str, str]:
        return (self.username, self.password)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.dir / "log" / f"{self.nodename}.log" if self.dir else None

    def _env(self) -> dict[str, str]:
        assert self.dir is not None
        # Our app's knobs share the RABBITMQ_ prefix with the server's own variables
        # (RABBITMQ_NODE_PORT, RABBITMQ_DEFAULT_USER, ...): pass none of them through.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(self.dir),  # holds the Erlang cookie; the ctl calls need the same
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),  # no .conf suffix
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            # Keep Erlang distribution (and a new epmd) on loopback too.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": self.host,
        })
        return env

    def _write_config(self) -> None:
        assert self.dir is not None
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {self.host}:{self.port}\n"
            f"management.tcp.ip = {self.host}\n"
            f"management.tcp.port = {self.management_port}\n"
            f"default_user = {self.username}\n"
            f"default_pass = {self.password}\n"
            "default_user_tags.administrator = true\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")

    def ctl(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n NODE ARGS`` against this node.

        Raises:
            ServicesUnavailable: when the command fails or times out.
        """
        assert self.binaries is not None
        cmd = [self.binaries["rabbitmqctl"], "-n", self.nodename, *args]
        try:
            result = subprocess.run(cmd, env=self._env(), capture_output=True, text=True,
                                    timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ServicesUnavailable(f"`rabbitmqctl {' '.join(args)}` timed out") from None
        if result.returncode != 0:
            raise ServicesUnavailable(
                f"`rabbitmqctl {' '.join(args)}` failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def start(self) -> LocalRabbitMQ:
        """Start the node, wait until it runs, then confirm an AMQP connection works."""
        if self.running:
            raise RuntimeError(f"{self.nodename} is already running")
        if self.binaries is None:
            self.binaries = find_binaries(["rabbitmq"])
        started_s = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-rabbitmq-"))
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port(self.host))
        self.port, self.management_port, self.dist_port = sorted(ports)
        self._write_config()
        stdout_path = self.dir / "stdout.log"
        logger.debug("starting %s in %s", self.nodename, self.dir)
        try:
            with stdout_path.open("wb") as stdout:
                # Foreground, in its own process group: the script turns SIGTERM into a clean
                # node stop, and killpg() is a sure fallback that leaves no beam.smp behind.
                self._proc = subprocess.Popen(
                    [self.binaries["rabbitmq-server"]], env=self._env(),
                    stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._wait_until_running(stdout_path)
            self._wait_for_amqp(timeout_s=30)
        except BaseException:
            self.stop()
            raise
        logger.info("rabbitmq %s started at amqp://%s:%d in %.1f s (management %s)",
                    self.nodename, self.host, self.port, time.monotonic() - started_s,
                    self.management_url)
        return self

    def _wait_until_running(self, stdout_path: Path) -> None:
        assert self.binaries is not None and self.dir is not None and self._proc is not None
        cmd = [self.binaries["rabbitmqctl"], "-n", self.nodename, "wait", str(self.dir / "pid"),
               "--timeout", str(int(self.start_timeout_s))]
        waiter = subprocess.Popen(cmd, env=self._env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + self.start_timeout_s + 15
        try:
            while waiter.poll() is None:
                if self._proc.poll() is not None:
                    raise ServicesUnavailable(
                        f"rabbitmq-server exited with {self._proc.returncode} during start-up:\n"
                        f"{_tail(stdout_path)}\n{_tail(self.log_path) if self.log_path else ''}")
                if time.monotonic() > deadline:
                    raise ServicesUnavailable(f"`rabbitmqctl wait` for {self.nodename} hung")
                time.sleep(0.1)
        finally:
            if waiter.poll() is None:
                waiter.kill()
            output, _ = waiter.communicate()
        if waiter.returncode != 0:
            raise ServicesUnavailable(
                f"{self.nodename} did not start ({waiter.returncode}): {output.strip()}\n"
                f"{_tail(self.log_path) if self.log_path else ''}")

    def connection_parameters(self, **kwargs: Any) -> pika.ConnectionParameters:
        """pika parameters for this node (``kwargs`` go to ``ConnectionParameters``)."""
        return pika.ConnectionParameters(
            host=self.host, port=self.port, virtual_host="/",
            credentials=pika.PlainCredentials(self.username, self.password), **kwargs)

    def _wait_for_amqp(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        params = self.connection_parameters(connection_attempts=1, socket_timeout=2,
                                            blocked_connection_timeout=2)
        while True:
            try:
                pika.BlockingConnection(params).close()
                return
            except pika.exceptions.AMQPConnectionError as exc:
                if time.monotonic() > deadline:
                    raise ServicesUnavailable(
                        f"{self.nodename} runs but refuses AMQP on port {self.port}: {exc!r}"
                    ) from None
                time.sleep(0.2)

    def stop_app(self) -> None:
        """Stop the RabbitMQ application but keep the Erlang node (a broker outage)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the application again after :meth:`stop_app` and wait until AMQP works."""
        self.ctl("start_app")
        self._wait_for_amqp(timeout_s=30)

    def stop(self) -> None:
        """Stop the node (``rabbitmqctl stop``, else kill its process group); delete the dir."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self.ctl("stop", timeout_s=30)
                except ServicesUnavailable as exc:
                    logger.warning("clean stop of %s failed, killing it: %s", self.nodename, exc)
                try:
                    self._proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    logger.warning("%s still running after rabbitmqctl stop", self.nodename)
            _terminate_group(self._proc, timeout_s=10)
            self._kill_beam_from_pid_file()
            self._proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _kill_beam_from_pid_file(self) -> None:
        """Last resort in case the VM left our process group."""
        assert self.dir is not None
        try:
            pid = int((self.dir / "pid").read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return  # gone
        if b"beam" in cmdline and self.nodename.encode() in cmdline:
            logger.warning("killing leftover beam.smp %d of %s", pid, self.nodename)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


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
        if not _is_loopback_host(host):
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
        from testcontainers.core.docker_client import DockerClient
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

    # Only talk to containers over loopback (the mapped ports on this machine).
    client = DockerClient()
    host = client.host()
    if not _is_loopback_host(host) or client.get_connection_mode().name != "docker_host":
        logger.debug("not using Docker: containers would be reached at %s", host)
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
                    _redact(result.rabbitmq_url), result.sources["rabbitmq"],
                    _redact(result.redis_url), result.sources["redis"])
        yield result


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def main() -> int:
    """``python -m devtools.services``: start the services, print their URLs, wait for ^C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with fleet_services() as found:
        print(f"export RABBITMQ_URL='{found.rabbitmq_url}'")
        print(f"export REDIS_URL='{found.redis_url}'")
        if found.management_url:
            auth = found.management_auth
            print(f"# management: {found.management_url}"
                  + (f" (user {auth[0]}, password {auth[1]})" if auth else ""))
        print("# Ctrl-C or SIGTERM stops them.", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def reset_state(rabbitmq_url: str, redis_url: str, *, all_databases: bool = False) -> None:
    """Empty the fleet's state: flush Redis (its database, or all with ``all_databases``) and
    delete and re-declare every queue and exchange of the topology."""
    import pika
    import redis

    from common.broker import topology

    client = redis.Redis.from_url(redis_url)
    try:
        client.flushall() if all_databases else client.flushdb()
    finally:
        client.close()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        topology.delete_all(channel)
        topology.declare(channel)
    finally:
        connection.close()
