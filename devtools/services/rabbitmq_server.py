"""A local RabbitMQ node with the management plugin on free loopback ports, in a temp dir.

Debian's ``/usr/sbin/rabbitmq-server`` is a wrapper that switches to the ``rabbitmq`` user and
drops the environment, so the node is started from the real scripts in
``/usr/lib/rabbitmq/bin`` (see :data:`devtools.services.base.RABBITMQ_BIN_DIRS`), configured
only through ``RABBITMQ_*`` variables and files in its own temporary directory. Start-up takes
5-20 s, so tests start one node per session.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from devtools.services.base import (
    LOOPBACK,
    Managed,
    ServicesUnavailable,
    find_binaries,
    free_port,
    tail,
    terminate_group,
)

logger = logging.getLogger(__name__)


class LocalRabbitMQ(Managed):
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
                        f"{tail(stdout_path)}\n{tail(self.log_path) if self.log_path else ''}")
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
                f"{tail(self.log_path) if self.log_path else ''}")

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
            terminate_group(self._proc, timeout_s=10)
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
                logger.debug("leftover beam.smp %d was already gone", pid)
