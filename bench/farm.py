"""A farm of static sites on loopback addresses, served by a real nginx whose log is the truth.

    farm = Farm.generate(root, sites=10, pages=2000)     # files + nginx.conf under root
    with NginxFarm(farm) as server:                       # nginx -g 'daemon off;' as a child
        ...
        requests = server.read_log(since=offset)          # parsed access-log lines

Site ``i`` (0-based) is served on ``127.0.0.(i+2):PORT`` (127.0.0.1 is left to the services).
Every site has ``/p/N.html`` for N in 1..pages (about 30 KB each with about 100 links: nav,
in-text links to pages of the same site in absolute, root-relative and relative form, a few to
other farm sites, a fragment), ``/robots.txt`` allowing everything and naming the sitemap, and
``/sitemap.xml`` listing every page. Pages are deterministic: the same (site, page) always gives
the same bytes.

The access log format is ``$msec $server_addr:$server_port $status $body_bytes_sent
"$request_uri" "$http_user_agent" $request_time``; $msec is the wall-clock time the response
finished, the same clock as ``time.time()``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.farm_pages import Site, page_html, paragraph_pool
from devtools.nginx_site import find_nginx

FIRST_HOST = ipaddress.IPv4Address("127.0.0.2")


@dataclass
class Farm:
    """The generated files and nginx config of one farm."""

    root: Path
    sites: list[Site]
    pages: int
    page_bytes_mean: int

    @property
    def conf_path(self) -> Path:
        return self.root / "nginx.conf"

    @property
    def log_path(self) -> Path:
        return self.root / "logs" / "access.log"

    def urls(self) -> list[str]:
        """Every page URL, sites interleaved (page 1 of each site, then page 2, ...)."""
        return [site.page_url(n) for n in range(1, self.pages + 1) for site in self.sites]

    @classmethod
    def generate(cls, root: Path, *, sites: int, pages: int, port: int | None = None) -> Farm:
        """Write ``sites`` × ``pages`` pages, robots.txt, sitemap.xml and nginx.conf under root.

        Args:
            root: an empty directory (created when missing).
            sites: number of sites (at most 250, each on its own 127.0.0.x address).
            pages: pages per site.
            port: TCP port every site listens on (default: one free on all the addresses).
        """
        if not 1 <= sites <= 250:
            raise ValueError("sites must be in 1..250")
        root.mkdir(parents=True, exist_ok=True)
        hosts = [str(FIRST_HOST + i) for i in range(sites)]
        port = port or _free_port_on_all(hosts)
        farm_sites = [Site(i, host, port) for i, host in enumerate(hosts)]
        pool = paragraph_pool()
        total = 0
        for site in farm_sites:
            site_dir = root / f"site{site.index}"
            (site_dir / "p").mkdir(parents=True, exist_ok=True)
            for n in range(1, pages + 1):
                body = page_html(site, n, pages, farm_sites, pool).encode("utf-8")
                (site_dir / "p" / f"{n}.html").write_bytes(body)
                total += len(body)
            (site_dir / "robots.txt").write_text(
                f"User-agent: *\nAllow: /\n\nSitemap: {site.base_url}/sitemap.xml\n")
            entries = "".join(f"<url><loc>{site.page_url(n)}</loc></url>\n"
                              for n in range(1, pages + 1))
            (site_dir / "sitemap.xml").write_text(
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
                f"{entries}</urlset>\n")
        farm = cls(root, farm_sites, pages, total // (sites * pages))
        farm._write_nginx_conf()
        return farm

    def _write_nginx_conf(self) -> None:
        for sub in ("logs", "tmp"):
            (self.root / sub).mkdir(exist_ok=True)
        servers = "\n".join(
            f"    server {{\n"
            f"        listen {site.host}:{site.port};\n"
            f"        server_name _;\n"
            f"        root {self.root / f'site{site.index}'};\n"
            f"        location / {{ }}\n"
            f"    }}"
            for site in self.sites)
        tmp = self.root / "tmp"
        # As root, nginx's workers would switch to 'nobody', which cannot read a 0700 temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        self.conf_path.write_text(
            f"{user}"
            "worker_processes 1;\n"
            f"pid {self.root / 'nginx.pid'};\n"
            f"error_log {self.root / 'logs' / 'error.log'} warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            "    types { text/html html; application/xml xml; text/plain txt; }\n"
            "    default_type application/octet-stream;\n"
            "    charset utf-8;\n"
            "    charset_types text/html text/plain application/xml;\n"
            "    sendfile on;\n"
            "    tcp_nopush on;\n"
            "    keepalive_timeout 65;\n"
            "    keepalive_requests 1000000;\n"
            "    server_tokens off;\n"
            f"    client_body_temp_path {tmp / 'body'};\n"
            f"    proxy_temp_path {tmp / 'proxy'};\n"
            f"    fastcgi_temp_path {tmp / 'fastcgi'};\n"
            f"    uwsgi_temp_path {tmp / 'uwsgi'};\n"
            f"    scgi_temp_path {tmp / 'scgi'};\n"
            "    log_format bench '$msec $server_addr:$server_port $status $body_bytes_sent '\n"
            "                     '\"$request_uri\" \"$http_user_agent\" $request_time';\n"
            f"    access_log {self.log_path} bench;\n"
            f"{servers}\n"
            "}\n")


def _free_port_on_all(hosts: list[str], attempts: int = 50) -> int:
    """A port that is free on every one of ``hosts`` right now."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        socks = []
        try:
            for host in hosts:
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no port free on every farm address")


@dataclass(frozen=True)
class LogLine:
    """One access-log line."""

    time_s: float  # $msec: when the response finished
    addr: str  # server_addr:server_port
    status: int
    bytes_sent: int
    uri: str
    user_agent: str
    request_time_s: float

    @property
    def host(self) -> str:
        return self.addr.rsplit(":", 1)[0]


_LOG_RE = re.compile(r'^(\S+) (\S+) (\d+) (\d+) "([^"]*)" "([^"]*)" (\S+)$')


def parse_log_line(line: str) -> LogLine | None:
    match = _LOG_RE.match(line.rstrip("\n"))
    if match is None:
        return None
    msec, addr, status, sent, uri, agent, rtime = match.groups()
    return LogLine(float(msec), addr, int(status), int(sent), uri, agent, float(rtime))


class NginxFarm:
    """nginx serving a :class:`Farm`, as a foreground child in its own process group."""

    def __init__(self, farm: Farm, binary: str | None = None, start_timeout_s: float = 10.0):
        self.farm = farm
        self.binary = binary or find_nginx()
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> NginxFarm:
        if self.binary is None:
            raise RuntimeError("nginx not found: apt-get install -y nginx (bench/run.sh does)")
        for site in self.farm.sites:
            if not ipaddress.ip_address(site.host).is_loopback:
                raise ValueError(f"farm sites bind loopback only, not {site.host}")
        error_log = self.farm.root / "logs" / "error.log"
        self._proc = subprocess.Popen(
            [self.binary, "-p", str(self.farm.root), "-c", str(self.farm.conf_path),
             "-e", str(error_log), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        site = self.farm.sites[-1]
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self._proc.returncode}: "
                                   f"{_tail(error_log)}")
            try:
                with socket.create_connection((site.host, site.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nginx did not listen within {self.start_timeout_s} s: "
                                       f"{_tail(error_log)}") from None
                time.sleep(0.05)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)  # fast shutdown of master and worker
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> NginxFarm:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def log_offset(self) -> int:
        """Where the access log ends now: pass it to :meth:`read_log` to read what follows."""
        try:
            return self.farm.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def read_log(self, since: int = 0) -> list[LogLine]:
        return list(self.iter_log(since))

    def iter_log(self, since: int = 0) -> Iterator[LogLine]:
        try:
            with self.farm.log_path.open("r", encoding="utf-8", errors="replace") as handle:
                handle.seek(since)
                for line in handle:
                    parsed = parse_log_line(line)
                    if parsed is not None:
                        yield parsed
        except FileNotFoundError:
            return


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"
