"""The producer's look at the fetch address guard: URLs no worker would be allowed to fetch.

A worker refuses to connect to an address the guard blocks (common/web/netguard.py: loopback,
private, link-local... unless FETCH_ALLOW_NETWORKS lists it) and dead-letters the URL as
``fetch_blocked``. Seeding such URLs (the Quick start's local site, an intranet) used to queue
them, dead-letter them all, and leave them seen: producing them again after allowing the
network said ``duplicate``. :class:`HostCheck` asks the same guard, with the same
FETCH_ALLOW_NETWORKS, before a URL is claimed or marked seen: a literal address directly, a host
name once per run, resolved (a name may resolve to several addresses: refused only when the
guard blocks every one, as the worker could connect to any other). A name that does not resolve
(in RESOLVE_TIMEOUT_S) is let through: the worker decides, as before. The worker's check on the
connected peer stays the one that counts (DNS can change in between); this one only spares the
user a queue of URLs bound to fail, and says how to allow them (:meth:`Refused.hint`).
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from common.core.config import Settings
from common.core.urls import Fingerprint, domain_of
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

#: How long one batch waits for its new host names to resolve; a name unanswered by then is
#: let through (the workers' guard decides), and later batches use its answer.
RESOLVE_TIMEOUT_S = 2.0
#: Lookups at a time: a few, as resolvers throttle bursts of parallel queries.
RESOLVE_THREADS = 4
#: Host verdicts kept per run; past it the cache starts again (a crawl over many hosts).
CACHE_MAX_HOSTS = 100_000
#: Refused URLs a summary names (the count has them all).
EXAMPLES = 5

#: Networks the guard blocks by default, named in the hint when a refused address is in one.
_KNOWN = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
    "169.254.0.0/16", "::1/128", "fc00::/7", "fe80::/10"))


def network_to_allow(address: str) -> str:
    """The CIDR to suggest for a refused address: its well-known range, else the address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # fe80::1%eth0: no zone in a CIDR
    for network in _KNOWN:
        if ip.version == network.version and ip in network:
            return str(network)
    return f"{ip}/{ip.max_prefixlen}"


@dataclass
class Refused:
    """URLs refused because the guard blocks their host: how many, the first few, and which
    networks would allow them."""

    count: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)  # (url, address)
    networks: list[str] = field(default_factory=list)

    def add(self, url: str, address: str, network: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append((url, address))
        if network not in self.networks:
            self.networks.append(network)

    def merge(self, other: Refused) -> None:
        self.count += other.count
        self.examples.extend(other.examples[:EXAMPLES - len(self.examples)])
        self.networks.extend(n for n in other.networks if n not in self.networks)

    def hint(self, allowed: Iterable[object] = ()) -> str:
        """What to tell the user: which URLs, why, and how to produce them again; ``allowed``
        is FETCH_ALLOW_NETWORKS now (kept in the value suggested)."""
        if not self.count:
            return ""
        lines = [f"refused {self.count} URL(s): the fetch address guard blocks their "
                 f"address, so no worker may fetch them (not queued, not marked seen):"]
        lines += [f"  {url}  ({address})" for url, address in self.examples]
        if self.count > len(self.examples):
            lines.append(f"  ... and {self.count - len(self.examples)} more")
        value = ",".join(dict.fromkeys([*(str(n) for n in allowed), *self.networks]))
        # up --allow-network takes private networks only, one a flag; --set takes any.
        if all(ipaddress.ip_network(n).is_private for n in self.networks):
            local = " ".join(f"--allow-network {n}" for n in self.networks)
        else:
            local = f"--set FETCH_ALLOW_NETWORKS={value}"
        lines.append(f"to fetch them, allow their network for the workers and the producer: "
                     f"FETCH_ALLOW_NETWORKS={value} (local mode: `scrape-fleet up {local}`), "
                     f"then produce them again.")
        return "\n".join(lines)


class HostCheck:
    """Which URLs the fetch address guard would refuse, host by host, cached for the run.

    Host names are looked up by a few daemon threads (a lookup cannot be interrupted, and a
    slow resolver must neither stall the producer for long nor keep it from exiting): a batch
    waits at most ``resolve_timeout_s`` for its new names, and a name still unanswered then is
    let through, as one that does not resolve (a later batch uses its answer once it comes).

    Args:
        guard: the workers' guard (:meth:`from_settings`: FETCH_ALLOW_NETWORKS).
        resolve_timeout_s: how long a batch waits for its new names to resolve.
    """

    def __init__(self, guard: AddressGuard, *,
                 resolve_timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
        self.guard = guard
        self.resolve_timeout_s = resolve_timeout_s
        self._verdicts: dict[str, tuple[str, str] | None] = {}  # host -> (address, network)
        self._answers: dict[str, list[str]] = {}  # name -> addresses, written by the lookups
        self._asked: set[str] = set()
        self._lookups: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._answered = threading.Condition()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> HostCheck:
        return cls(AddressGuard(settings.fetch_allow_networks))

    @classmethod
    def for_fleet(cls, settings: Settings, workers: Iterable[dict]) -> HostCheck:
        """The guard of the workers that will fetch: the networks the live workers' heartbeats
        say they allow (their FETCH_ALLOW_NETWORKS, together), else this process's own. A
        producer whose FETCH_ALLOW_NETWORKS differs from the workers' (set on the scrapers
        only) neither refuses what they would fetch nor lets through what none would."""
        told = [w["fetch_allow_networks"] for w in workers
                if isinstance(w.get("fetch_allow_networks"), list)]
        if not told:
            return cls.from_settings(settings)
        networks = {ipaddress.ip_network(n, strict=False) for one in told for n in one}
        own = set(settings.fetch_allow_networks)
        if networks != own:
            logger.info("checking hosts against the %d live workers' FETCH_ALLOW_NETWORKS "
                        "(%s), not this process's (%s)", len(told),
                        ",".join(sorted(map(str, networks))) or "none",
                        ",".join(sorted(map(str, own))) or "none")
        return cls(AddressGuard(sorted(networks, key=str)))

    def keep_allowed(self, candidates: list[tuple[str, Fingerprint]], refused: Refused
                     ) -> list[tuple[str, Fingerprint]]:
        """The candidates (canonical URL, fingerprint) whose host the guard lets through; the
        others are added to ``refused``."""
        hosts = {url: domain_of(url) for url, _fp in candidates}
        self._judge(set(hosts.values()))
        kept = []
        for url, fp in candidates:
            verdict = self._verdicts.get(hosts[url])
            if verdict is None:
                kept.append((url, fp))
            else:
                refused.add(url, *verdict)
        return kept

    def _judge(self, hosts: set[str]) -> None:
        if len(self._verdicts) > CACHE_MAX_HOSTS:
            self._verdicts.clear()
            self._asked.clear()
        names = []
        for host in hosts - self._verdicts.keys():
            try:
                ipaddress.ip_address(host)
            except ValueError:
                names.append(host)
                continue
            self._verdicts[host] = self._verdict([host])
        if names:
            self._resolve(names)

    def _resolve(self, names: list[str]) -> None:
        for name in names:
            if name not in self._asked:
                self._asked.add(name)
                self._lookups.put(name)
        while len(self._threads) < min(RESOLVE_THREADS, len(self._asked)):
            thread = threading.Thread(target=self._look_up, name="resolve", daemon=True)
            thread.start()
            self._threads.append(thread)
        deadline = time.monotonic() + self.resolve_timeout_s
        with self._answered:
            while not all(name in self._answers for name in names):
                left = deadline - time.monotonic()
                if left <= 0 or not self._answered.wait(left):
                    break
        for name in names:
            if name in self._answers:
                self._verdicts[name] = self._verdict(self._answers.pop(name))
            else:
                logger.info("host %s did not resolve within %.1fs: left to the workers' guard",
                            name, self.resolve_timeout_s)

    def _verdict(self, addresses: list[str]) -> tuple[str, str] | None:
        """(a blocked address, the network to allow) when the guard blocks every address;
        None when any is allowed or there is none (a name that does not resolve)."""
        blocked = [address for address in addresses if not self.guard.allowed(address)]
        if not addresses or len(blocked) < len(addresses):
            return None
        return blocked[0], network_to_allow(blocked[0])

    def _look_up(self) -> None:
        while True:
            name = self._lookups.get()
            addresses = _addresses(name)
            with self._answered:
                self._answers[name] = addresses
                self._answered.notify_all()


def _addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to; [] when it does not (the worker then decides)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        logger.debug("host %s does not resolve (%s): left to the workers' guard", host, exc)
        return []
    return sorted({str(info[4][0]) for info in infos})
