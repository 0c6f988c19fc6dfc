"""A RabbitMQ node with the management plugin, run from Debian's scripts on loopback ports and
configured only through ``RABBITMQ_*`` variables and files in its own directory.

Debian's ``/usr/sbin/rabbitmq-server`` is a wrapper that switches to the ``rabbitmq`` user and
drops the environment, so the node is started from the real scripts in
``/usr/lib/rabbitmq/bin`` (:data:`common.ops.servers.RABBITMQ_BIN_DIRS`). The directory holds
the node's data (``mnesia``), logs, config and Erlang cookie (it is the node's HOME, which
``rabbitmqctl`` needs too): a node started again on the same directory and name keeps its
queues, messages and users. Start-up takes 5-20 s. Local mode keeps one node per fleet
directory (:mod:`common.ops.local_mode`); the test tooling one per session in a temp dir
(``devtools.services.rabbitmq_server``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from common.ops.fleet_dir import write_private
from common.ops.servers import LOOPBACK, ServicesUnavailable, find_binaries, tail, terminate_group

logger = logging.getLogger(__name__)


class RabbitNode:
    """One node: its name, directory, ports and only user (created by the broker on first
    boot from ``default_user``/``default_pass``; later boots keep the stored one).

    Args:
        directory: the node's HOME and data directory (None until the caller picks one).
        nodename: ``name@localhost``, unique among the nodes running on this machine.
        username: the broker's user (administrator: the management UI accepts it).
        password: its password.
        port: AMQP port; management_port: HTTP API and UI; dist_port: Erlang distribution.
        binaries: paths from :func:`~common.ops.servers.find_binaries` (default: looked up).
        start_timeout_s: upper bound for ``rabbitmqctl wait``.
    """

    def __init__(self, directory: Path | None, nodename: str, username: str, password: str, *,
                 port: int = 0, management_port: int = 0, dist_port: int = 0,
                 binaries: Mapping[str, str] | None = None, host: str = LOOPBACK,
                 start_timeout_s: float = 90.0) -> None:
        self.dir = directory
        self.nodename = nodename
        self.username = username
        self.password = password
        self.port = port
        self.management_port = management_port
        self.dist_port = dist_port
        self.binaries = dict(binaries) if binaries else None
        self.host = host
        self.start_timeout_s = start_timeout_s

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
    def log_path(self) -> Path | None:
        return self.dir / "log" / f"{self.nodename}.log" if self.dir else None

    def server_env(self) -> dict[str, str]:
        """The environment of the server and of every ``rabbitmqctl`` call for this node."""
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

    def write_config(self) -> None:
        """rabbitmq.conf (listeners on loopback, the user) and enabled_plugins (management)."""
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        # The password is in this file only (0600 from its first byte), never on the
        # server's or rabbitmqctl's command line or in their environment.
        write_private(self.dir / "rabbitmq.conf",
                      f"listeners.tcp.default = {self.host}:{self.port}\n"
                      f"management.tcp.ip = {self.host}\n"
                      f"management.tcp.port = {self.management_port}\n"
                      f"default_user = {self.username}\n"
                      f"default_pass = {self.password}\n"
                      "default_user_tags.administrator = true\n")
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")

    def ctl(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n NODE ARGS`` against this node.

        Raises:
            ServicesUnavailable: when the command fails or times out.
        """
        if self.binaries is None:
            self.binaries = find_binaries(["rabbitmq"])
        cmd = [self.binaries["rabbitmqctl"], "-n", self.nodename, *args]
        try:
            result = subprocess.run(cmd, env=self.server_env(), capture_output=True, text=True,
                                    timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ServicesUnavailable(f"`rabbitmqctl {' '.join(args)}` timed out") from None
        if result.returncode != 0:
            raise ServicesUnavailable(
                f"`rabbitmqctl {' '.join(args)}` failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def launch(self, stdout_path: Path) -> subprocess.Popen[bytes]:
        """Write the config, start the node in its own process group, wait until it runs and
        an AMQP connection works. On failure the group is stopped and ServicesUnavailable
        raised."""
        if self.binaries is None:
            self.binaries = find_binaries(["rabbitmq"])
        self.write_config()
        logger.debug("starting %s in %s", self.nodename, self.dir)
        with stdout_path.open("wb") as stdout:
            # Foreground, in its own process group: the script turns SIGTERM into a clean
            # node stop, and killpg() is a sure fallback that leaves no beam.smp behind.
            proc = subprocess.Popen(
                [self.binaries["rabbitmq-server"]], env=self.server_env(),
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self._wait_until_running(proc, stdout_path)
            self.wait_for_amqp(timeout_s=30)
        except BaseException:
            terminate_group(proc, timeout_s=10)
            self.kill_leftover_beam()
            raise
        return proc

    def _wait_until_running(self, proc: subprocess.Popen[bytes], stdout_path: Path) -> None:
        assert self.binaries is not None and self.dir is not None
        cmd = [self.binaries["rabbitmqctl"], "-n", self.nodename, "wait", str(self.dir / "pid"),
               "--timeout", str(int(self.start_timeout_s))]
        waiter = subprocess.Popen(cmd, env=self.server_env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + self.start_timeout_s + 15
        try:
            while waiter.poll() is None:
                if proc.poll() is not None:
                    raise ServicesUnavailable(
                        f"rabbitmq-server exited with {proc.returncode} during start-up:\n"
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

    def wait_for_amqp(self, timeout_s: float) -> None:
        """Until an AMQP connection with the node's user opens (raises after ``timeout_s``)."""
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

    def beam_pid(self) -> int | None:
        """The node's Erlang VM (its pid file), when it is still running as this node."""
        if self.dir is None:
            return None
        try:
            pid = int((self.dir / "pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None  # never started, or gone
        return pid if b"beam" in cmdline and self.nodename.encode() in cmdline else None

    def kill_leftover_beam(self) -> None:
        """Last resort in case the VM left its process group."""
        pid = self.beam_pid()
        if pid is None:
            return
        logger.warning("killing leftover beam.smp %d of %s", pid, self.nodename)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            logger.debug("leftover beam.smp %d was already gone", pid)
