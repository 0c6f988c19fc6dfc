"""A Redis Cluster on loopback: ``primaries`` primaries with ``replicas`` replicas each, every
node a :class:`~devtools.services.redis_server.LocalRedis` child process in its own temporary
directory (``cluster-enabled yes``, no RDB, no AOF), joined by ``redis-cli --cluster create``.

``cluster-node-timeout`` is 2 s (as the Sentinel group's ``down_after_ms``): a ``kill -9``-ed
primary is failed over by its replica a few seconds later. The helpers find the primary that
owns a key or a slot, kill it and wait for the promotion, for the chaos test
(tests/test_redis_cluster_fleet.py).

    with RedisClusterGroup() as cluster:
        env = cluster.env                      # REDIS_URL=redis+cluster://h:p,h:p,...
        node = cluster.primary_for_key("results:{s0}")
        killed_at = cluster.kill(node)
        promoted, at = cluster.wait_for_failover(node)
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import redis
import redis.exceptions
from redis.cluster import key_slot

from devtools.services.base import (
    LOOPBACK,
    Managed,
    ServicesUnavailable,
    find_binaries,
    free_port,
    tail,
)
from devtools.services.redis_sentinel import wait_until
from devtools.services.redis_server import LocalRedis

logger = logging.getLogger(__name__)
#: Starts of one node on fresh ports before a bind failure is reported.
BIND_TRIES = 5

Address = tuple[str, int]
#: How long a node may be silent before the cluster holds it failed (ms).
NODE_TIMEOUT_MS = 2000


def _client(address: Address) -> redis.Redis:
    return redis.Redis(host=address[0], port=address[1], socket_timeout=2,
                       socket_connect_timeout=1)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisClusterGroup(Managed):
    """``primaries`` x (1 + ``replicas``) cluster nodes on loopback, slots split evenly by
    ``redis-cli --cluster create``.

    Args:
        primaries: how many primaries (3: the smallest cluster that keeps a majority of
            primaries through the loss of one).
        replicas: replicas per primary (1: each primary's loss is failed over).
        node_timeout_ms: ``cluster-node-timeout``.
        ready_timeout_s: how long start-up and each wait may take.
    """

    def __init__(self, *, primaries: int = 3, replicas: int = 1, binary: str | None = None,
                 node_timeout_ms: int = NODE_TIMEOUT_MS, ready_timeout_s: float = 60.0) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.binary = binary
        self.node_timeout_ms = node_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[LocalRedis] = []

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> RedisClusterGroup:
        """Every node, then ``--cluster create``; returns once every node says
        ``cluster_state:ok`` and every replica is in sync."""
        binaries = find_binaries(["redis"]) if self.binary is None else {}
        binary = self.binary or binaries["redis-server"]
        cli = str(Path(binary).with_name("redis-cli"))
        try:
            for _ in range(self.primaries * (1 + self.replicas)):
                self.nodes.append(self._start_node(binary))
            create = subprocess.run(
                [cli, "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=self.ready_timeout_s, check=False)
            if create.returncode != 0:
                raise ServicesUnavailable(f"redis-cli --cluster create failed:\n"
                                          f"{create.stdout[-2000:]}{create.stderr[-2000:]}")
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        logger.info("redis cluster on %s", self.env["REDIS_URL"])
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    # -- what clients need ------------------------------------------------------------------------
    @property
    def addresses(self) -> list[Address]:
        return [(node.host, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://`` of every node (a client needs one that answers)."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.addresses)

    @property
    def env(self) -> dict[str, str]:
        """The settings that point a fleet process at this cluster."""
        return {"REDIS_URL": self.url}

    def client(self) -> redis.cluster.RedisCluster:
        """A plain redis-py cluster client (the test's own view, not the fleet's factory)."""
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in self.addresses
                 if self.node_at((h, p)).running]
        return redis.cluster.RedisCluster(startup_nodes=nodes, socket_timeout=2,
                                          socket_connect_timeout=1)

    def node_at(self, address: Address) -> LocalRedis:
        return next(node for node in self.nodes if (node.host, node.port) == address)

    # -- topology ---------------------------------------------------------------------------------
    def slot_owners(self) -> dict[tuple[int, int], Address]:
        """Slot range (first, last) -> its primary, as a running node sees it."""
        for node in self.nodes:
            if not node.running:
                continue
            client = _client((node.host, node.port))
            try:
                ranges = client.execute_command("CLUSTER SLOTS")
            except redis.exceptions.RedisError:
                continue  # a node being killed or failed over: ask the next one
            finally:
                client.close()
            # redis-py parses CLUSTER SLOTS into {(first, last): {"primary": (host, port)...}}
            if isinstance(ranges, dict):
                return {span: (LOOPBACK, int(info["primary"][1]))
                        for span, info in ranges.items()}
            return {(int(r[0]), int(r[1])): (_text(r[2][0]), int(r[2][1])) for r in ranges}
        raise ServicesUnavailable("no cluster node answers CLUSTER SLOTS")

    def primary_for_slot(self, slot: int) -> Address:
        for (first, last), address in self.slot_owners().items():
            if first <= slot <= last:
                return address
        raise ServicesUnavailable(f"slot {slot} is not served")

    def primary_for_key(self, key: str) -> Address:
        return self.primary_for_slot(key_slot(key.encode()))

    def primary_addresses(self) -> list[Address]:
        return sorted(set(self.slot_owners().values()))

    def flush(self) -> None:
        """Empty every primary (its replicas follow): a test starts from nothing."""
        for host, port in self.primary_addresses():
            node = redis.Redis(host=host, port=port, socket_timeout=5)
            try:
                node.flushall()
            finally:
                node.close()

    # -- faults -----------------------------------------------------------------------------------
    def kill(self, address: Address) -> float:
        """``kill -9`` the node at ``address``; returns when (``time.time()``)."""
        self.node_at(address).kill()
        logger.info("killed the redis cluster node on port %d", address[1])
        return time.time()

    def wait_for_failover(self, old: Address, timeout_s: float = 30.0) -> tuple[Address, float]:
        """Wait until the slots ``old`` served have another primary that says ``master`` and
        the cluster is ``ok`` again.

        Returns:
            The new primary's address and when it was first seen so (``time.time()``).
        """
        found: list[Address] = []
        served = [first for (first, _last), owner in self.slot_owners().items() if owner == old]

        def promoted() -> bool:
            owners = set(self.slot_owners().values())
            if old in owners:
                return False
            for address in owners:
                client = _client(address)
                try:
                    if _text(client.execute_command("ROLE")[0]) != "master":
                        return False
                finally:
                    client.close()
            found[:] = [self.primary_for_slot(served[0])] if served else sorted(owners)
            return self._all_ok()

        wait_until(f"a replica promoted in place of port {old[1]}", promoted, timeout_s,
                   step_s=0.05)
        return found[0], time.time()

    def _start_node(self, binary: str) -> LocalRedis:
        """One cluster node on free ports. A port found free can be taken before the node binds
        it (another test process starting servers meanwhile: a CI run lost a bus port that
        way), so a node that could not bind starts again on other ports, up to BIND_TRIES."""
        attempt = 1
        while True:
            node = LocalRedis(binary=binary, extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-config-file", "nodes.conf",
                # the bus port defaults to port + 10000, past 65535 for a high free port
                "--cluster-port", str(free_port())])
            try:
                return node.start()
            except ServicesUnavailable as exc:
                if "Address already in use" not in str(exc) or attempt == BIND_TRIES:
                    raise
                logger.warning("redis cluster node: a port was taken before it bound; "
                               "trying other ports (%d of %d)", attempt, BIND_TRIES)
            attempt += 1

    def wait_healthy(self) -> None:
        """Every running node says ``cluster_state:ok`` and knows every slot's primary, and
        every primary's replicas are in sync."""
        wait_until("cluster_state:ok on every node", self._all_ok, self.ready_timeout_s)

        def synced() -> bool:
            for address in self.primary_addresses():
                client = _client(address)
                try:
                    info = client.info("replication")
                finally:
                    client.close()
                online = [v for k, v in info.items() if k.startswith("slave")
                          and isinstance(v, dict) and v.get("state") == "online"]
                if len(online) < self.replicas:
                    return False
            return True

        wait_until("every primary's replicas in sync", synced, self.ready_timeout_s)

    def _all_ok(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            client = _client((node.host, node.port))
            try:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
            finally:
                client.close()
        return True

    def cpu_s(self) -> dict[Address, float]:
        """used_cpu_sys + used_cpu_user of each running primary (s)."""
        figures = {}
        for address in self.primary_addresses():
            client = _client(address)
            try:
                info = client.info("cpu")
            finally:
                client.close()
            figures[address] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return figures

    def logs(self) -> str:
        """The last lines of every node's log (for a failing test's message)."""
        return "\n".join(f"--- {node.port}\n{tail(node.dir / 'redis.log')}"
                         for node in self.nodes if node.dir is not None)

    def heal(self) -> None:
        """Start every killed node again (it rejoins from its nodes.conf, as a replica of the
        primary that replaced it) and wait until the cluster is healthy."""
        for node in self.nodes:
            if not node.running:
                node.start()
        self.wait_healthy()
