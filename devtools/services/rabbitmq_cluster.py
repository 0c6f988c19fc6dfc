"""A RabbitMQ cluster of local nodes on loopback, for node-loss tests: kill -9 one, restart it.

Each node is a :class:`~common.ops.rabbit_node.RabbitNode` with its own name, directory
(data, logs, config, HOME), AMQP, management and distribution ports; the nodes share one user
and one Erlang cookie (the same ``.erlang.cookie`` in every HOME, so ``rabbitmqctl`` with any
node's environment reaches all of them). They boot side by side, then every node after the
first joins it (``stop_app``, ``join_cluster``, ``start_app``), as /work/shared's
LOCAL-SERVICES.md describes for 3.10. Quorum queues need a majority of the nodes up.

:meth:`LocalRabbitCluster.kill` is ``kill -9`` of a node's Erlang VM (its pid file); its
directory stays, and :meth:`LocalRabbitCluster.restart` starts the same node again, which
rejoins the cluster and catches its quorum queue replicas up.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from common.ops.rabbit_node import RabbitNode
from devtools.services.base import (
    LOOPBACK,
    Managed,
    ServicesUnavailable,
    find_binaries,
    free_port,
    terminate_group,
)

logger = logging.getLogger(__name__)


#: How long a quorum queue's at-least-once dead-letter worker waits for the target queue's
#: confirm before sending again (RabbitMQ's default: 180 s on 3.10, 120 s later). When the
#: target's leader dies with forwards unconfirmed, the hold queues' hops stall that long
#: (NOTES.md #40); duplicates it may cause are harmless (the done-set).
DLX_CONFIRM_TIMEOUT_MS = 5000


class ClusterNode(RabbitNode):
    """A cluster member: a RabbitNode with an ``advanced.config`` (DLX_CONFIRM_TIMEOUT_MS)."""

    def server_env(self) -> dict[str, str]:
        assert self.dir is not None
        env = super().server_env()
        env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(self.dir / "advanced.config")
        return env

    def write_config(self) -> None:
        super().write_config()
        assert self.dir is not None
        (self.dir / "advanced.config").write_text(
            "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, "
            f"{DLX_CONFIRM_TIMEOUT_MS}}}]}}].\n")


class LocalRabbitCluster(Managed):
    """``size`` RabbitMQ nodes on 127.0.0.1 joined into one cluster, in a temp dir.

    Args:
        size: number of nodes (3: one may die and quorum queues keep a majority).
        start_timeout_s: upper bound for each node's start-up.
    """

    def __init__(self, size: int = 3, *, start_timeout_s: float = 120.0) -> None:
        self.size = size
        self.start_timeout_s = start_timeout_s
        suffix = secrets.token_hex(3)
        self.username = f"fleet-{suffix}"
        self.password = secrets.token_urlsafe(18)
        self._names = [f"rabbit-{suffix}-{chr(ord('a') + i)}@localhost" for i in range(size)]
        self.dir: Path | None = None
        self.nodes: list[ClusterNode] = []
        self._procs: list[subprocess.Popen[bytes] | None] = []

    # -- addresses ------------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        """Every node's AMQP URL, in node order."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """The comma-separated list RABBITMQ_URLS takes."""
        return ",".join(self.urls)

    @property
    def management_urls(self) -> list[str]:
        return [node.management_url for node in self.nodes]

    @property
    def management_auth(self) -> tuple[str, str]:
        return (self.username, self.password)

    def running(self, index: int) -> bool:
        proc = self._procs[index]
        return proc is not None and proc.poll() is None

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> LocalRabbitCluster:
        """Boot every node side by side, then join them to the first."""
        started_s = time.monotonic()
        binaries = find_binaries(["rabbitmq"])
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-rabbit-cluster-"))
        cookie = secrets.token_hex(20)
        ports: set[int] = set()
        while len(ports) < 3 * self.size:
            ports.add(free_port(LOOPBACK))
        ordered = sorted(ports)
        for index, name in enumerate(self._names):
            directory = self.dir / name.split("@")[0]
            directory.mkdir(parents=True)
            cookie_file = directory / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
            amqp, management, dist = ordered[3 * index:3 * index + 3]
            self.nodes.append(ClusterNode(
                directory, name, self.username, self.password, port=amqp,
                management_port=management, dist_port=dist, binaries=binaries,
                start_timeout_s=self.start_timeout_s))
            self._procs.append(None)
        try:
            self._boot(range(self.size))
            first = self.nodes[0].nodename
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first)
                node.ctl("start_app")
                node.wait_for_amqp(timeout_s=60)
            status = self.nodes[0].ctl("cluster_status", "--formatter", "json").stdout
            missing = [node.nodename for node in self.nodes if node.nodename not in status]
            if missing:
                raise ServicesUnavailable(f"nodes not in the cluster: {missing}")
        except BaseException:
            self.stop()
            raise
        logger.info("rabbitmq cluster of %d nodes up in %.1f s: %s", self.size,
                    time.monotonic() - started_s, ", ".join(
                        f"{n.nodename} amqp {n.port} mgmt {n.management_port}"
                        for n in self.nodes))
        return self

    def _boot(self, indexes: Any) -> None:
        """Launch the nodes at ``indexes`` in threads (each boot waits for its node)."""
        errors: list[BaseException] = []

        def boot(index: int) -> None:
            node = self.nodes[index]
            assert node.dir is not None
            (node.dir / "pid").unlink(missing_ok=True)  # a killed node's: `wait` would read it
            try:
                self._procs[index] = node.launch(node.dir / "stdout.log")
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller
                errors.append(exc)

        threads = [threading.Thread(target=boot, args=(i,)) for i in indexes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def kill(self, index: int) -> None:
        """``kill -9`` node ``index``'s Erlang VM: a crashed machine, nothing flushed."""
        node, proc = self.nodes[index], self._procs[index]
        pid = _beam_pid(node)
        if pid is None or proc is None:
            raise RuntimeError(f"{node.nodename} is not running")
        os.kill(pid, signal.SIGKILL)
        terminate_group(proc, timeout_s=10)  # the start script and erl_child_setup
        self._procs[index] = None
        logger.info("killed %s (beam.smp %d) with SIGKILL", node.nodename, pid)

    def restart(self, index: int) -> None:
        """Start node ``index`` again on its own directory; it rejoins the cluster."""
        started_s = time.monotonic()
        self._boot([index])
        logger.info("restarted %s in %.1f s", self.nodes[index].nodename,
                    time.monotonic() - started_s)

    def stop(self) -> None:
        """Kill every node at once (SIGKILL) and delete the dir. The cluster is throwaway (its
        directory goes with it), so nothing is gained by a clean ``rabbitmqctl stop`` of each
        node in turn but ~4 s a node at the end of every test session."""
        for index, node in enumerate(self.nodes):
            pid = _beam_pid(node)
            if pid is not None and self._procs[index] is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    logger.info("%s had already exited", node.nodename)
        for index in range(len(self.nodes)):
            proc = self._procs[index]
            if proc is not None:
                terminate_group(proc, timeout_s=10)  # the start script and erl_child_setup
                self._procs[index] = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    # -- inspection -----------------------------------------------------------------------------
    def api(self, path: str) -> Any:
        """GET the management API at ``path`` from the first node that answers."""
        for index, node in enumerate(self.nodes):
            if not self.running(index):
                continue
            try:
                response = requests.get(f"{node.management_url}/api/{path}",
                                        auth=self.management_auth, timeout=5)
                response.raise_for_status()
                return response.json()
            except requests.RequestException as exc:
                logger.debug("management API of %s: %s", node.nodename, exc)
        raise ServicesUnavailable(f"no node's management API answered /api/{path}")

    def connections_by_node(self, name_prefix: str) -> dict[str, int]:
        """How many client connections named ``name_prefix...`` each node holds."""
        counts = {node.nodename: 0 for node in self.nodes}
        for connection in self.api("connections"):
            name = (connection.get("client_properties") or {}).get("connection_name", "")
            if name.startswith(name_prefix):
                counts[connection["node"]] = counts.get(connection["node"], 0) + 1
        return counts

    def index_of(self, nodename: str) -> int:
        return [node.nodename for node in self.nodes].index(nodename)


def _beam_pid(node: RabbitNode) -> int | None:
    """The node's Erlang VM from its pid file, if it still runs. 3.10 names the node at run
    time, not on the command line, so it is recognised by its ``-home`` directory."""
    assert node.dir is not None
    try:
        pid = int((node.dir / "pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    home = b"\0-home\0" + str(node.dir).encode() + b"\0"
    return pid if b"beam" in cmdline and home in cmdline else None
