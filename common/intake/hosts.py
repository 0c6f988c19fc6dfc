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

import concurrent.futures
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from common.core.config import Settings
from common.core.urls import Fingerprint, domain_of
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

#: How long one batch waits for its new host names to resolve; later answers are not waited for.
RESOLVE_TIMEOUT_S = 2.0
RESOLVE_THREADS = 16
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
    ip = ipaddress.ip_address(address)
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

    def add(self, url: str, address: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append((url, address))
        network = network_to_allow(address)
        if network not in self.networks:
            self.networks.append(network)

    def merge(self, other: Refused) -> None:
        self.count += other.count
        self.examples.extend(other.examples[:EXAMPLES - len(self.examples)])
        self.networks.extend(n for n in other.networks if n not in self.networks)

    def hint(self) -> str:
        """What to tell the user: which URLs, why, and how to produce them again."""
        if not self.count:
            return ""
        lines = [f"refused {self.count} URL(s): the fetch address guard blocks their "
                 f"address, so no worker may fetch them (not queued, not marked seen):"]
        lines += [f"  {url}  ({address})" for url, address in self.examples]
        if self.count > len(self.examples):
            lines.append(f"  ... and {self.count - len(self.examples)} more")
        networks = ",".join(self.networks)
        lines.append(f"to fetch them, allow the network for the workers and the producer: "
                     f"FETCH_ALLOW_NETWORKS={networks} (local mode: `scrape-fleet up "
                     f"--allow-network {networks}`), then produce them again.")
        return "\n".join(lines)


class HostCheck:
    """Which URLs the fetch address guard would refuse, host by host, cached for the run.

    Args:
        guard: the workers' guard (:meth:`from_settings`: FETCH_ALLOW_NETWORKS).
        resolve_timeout_s: how long a batch waits for its new names to resolve.
    """

    def __init__(self, guard: AddressGuard, *,
                 resolve_timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
        self.guard = guard
        self.resolve_timeout_s = resolve_timeout_s
        self._verdicts: dict[str, str | None] = {}  # host -> a blocked address, or None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> HostCheck:
        return cls(AddressGuard(settings.fetch_allow_networks))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def keep_allowed(self, candidates: list[tuple[str, Fingerprint]], refused: Refused
                     ) -> list[tuple[str, Fingerprint]]:
        """The candidates (canonical URL, fingerprint) whose host the guard lets through; the
        others are added to ``refused``."""
        hosts = {url: domain_of(url) for url, _fp in candidates}
        self._judge(set(hosts.values()))
        kept = []
        for url, fp in candidates:
            address = self._verdicts.get(hosts[url])
            if address is None:
                kept.append((url, fp))
            else:
                refused.add(url, address)
        return kept

    def _judge(self, hosts: Iterable[str]) -> None:
        new = [host for host in hosts if host not in self._verdicts]
        if not new:
            return
        if len(self._verdicts) + len(new) > CACHE_MAX_HOSTS:
            self._verdicts.clear()
        names = []
        for host in new:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                names.append(host)
                continue
            self._verdicts[host] = None if self.guard.allowed(host) else host
        if not names:
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(RESOLVE_THREADS,
                                                               thread_name_prefix="resolve")
        futures = {self._pool.submit(_addresses, name): name for name in names}
        done, late = concurrent.futures.wait(futures, timeout=self.resolve_timeout_s)
        for future in late:
            logger.info("host %s did not resolve within %.1fs: left to the workers' guard",
                        futures[future], self.resolve_timeout_s)
        for future, name in futures.items():
            addresses = future.result() if future in done else []
            blocked = [a for a in addresses if not self.guard.allowed(a)]
            self._verdicts[name] = blocked[0] if addresses and len(blocked) == len(
                addresses) else None


def _addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to; [] when it does not (the worker then decides)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        logger.debug("host %s does not resolve (%s): left to the workers' guard", host, exc)
        return []
    return sorted({str(info[4][0]) for info in infos})
