"""A local RabbitMQ node with the management plugin on free loopback ports, in a temp dir.

The node itself (config, environment, ``rabbitmqctl``, start-up checks) is
:class:`common.ops.rabbit_node.RabbitNode`, shared with local mode; this class gives it a
random name, user and password, a temporary directory and free ports, and deletes the
directory when it stops. Start-up takes 5-20 s, so tests start one node per session.
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

from common.ops.rabbit_node import RabbitNode
from devtools.services.base import Managed, free_port, terminate_group

logger = logging.getLogger(__name__)


class LocalRabbitMQ(RabbitNode, Managed):
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
        suffix = secrets.token_hex(4)
        super().__init__(None, f"rabbit-{suffix}@localhost", f"fleet-{suffix}",
                         secrets.token_urlsafe(18), binaries=binaries,
                         start_timeout_s=start_timeout_s)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRabbitMQ:
        """Start the node, wait until it runs, then confirm an AMQP connection works."""
        if self.running:
            raise RuntimeError(f"{self.nodename} is already running")
        started_s = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-rabbitmq-"))
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port(self.host))
        self.port, self.management_port, self.dist_port = sorted(ports)
        try:
            self._proc = self.launch(self.dir / "stdout.log")
        except BaseException:
            self.stop()
            raise
        logger.info("rabbitmq %s started at amqp://%s:%d in %.1f s (management %s)",
                    self.nodename, self.host, self.port, time.monotonic() - started_s,
                    self.management_url)
        return self

    def stop_app(self) -> None:
        """Stop the RabbitMQ application but keep the Erlang node (a broker outage)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the application again after :meth:`stop_app` and wait until AMQP works."""
        self.ctl("start_app")
        self.wait_for_amqp(timeout_s=30)

    def stop(self) -> None:
        """Kill the node (SIGKILL to its process group: the start script, beam.smp and
        erl_child_setup) and delete its directory. The node is throwaway, its directory goes
        with it, so a clean ``rabbitmqctl stop`` would only add ~5 s to the end of every test
        session (as for the cluster's nodes)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    logger.debug("%s had already exited", self.nodename)
            terminate_group(self._proc, timeout_s=10)
            self.kill_leftover_beam()
            self._proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
