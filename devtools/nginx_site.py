"""Debian's nginx serving one directory on loopback, for tests that want the real web's server.

    with NginxSite(root, tls=(cert, key), brotli=True) as site:   # https://127.0.0.1:PORT, h2
        fetcher.fetch(site.url("/index.html"))
        site.requests()            # [(path, status), ...] from nginx's own access log

nginx runs as a foreground child (``-g 'daemon off;'``) in its own process group with its
config, pid file, logs and temp paths in a private directory; it listens on 127.0.0.1 at a
free port. Options:

* ``tls=(cert_path, key_path)``: ``listen ... ssl http2`` (HTTP/2 via ALPN; plain HTTP/1.1
  clients still work over TLS).
* ``brotli=True``: loads Debian's ``libnginx-mod-http-brotli-filter`` module and compresses
  text/html, text/plain and application/xml when the client offers ``br``.
* ``gzip=True``: nginx's own gzip for the same types.
* ``server_extra``: config text inserted in the ``server`` block (locations, headers...).
* ``error_log_level``: nginx's (``info`` says more about TLS handshakes).

:meth:`NginxSite.connections` counts the TCP connections clients opened (nginx's stub_status,
served on a second, plain-HTTP port whose own connections are not counted): a client that
gives up in the TLS handshake (libcurl refusing the certificate) sends no request, so the
access log never shows it, but its connection is counted.

The access log line is ``$status "$request"``: no cookie, no user agent, nothing a test did
not ask for. :meth:`NginxSite.requests` reads it as ``(path, status)`` pairs (the path as
requested, query included).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

NGINX_BIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin")
BROTLI_MODULE = Path("/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so")
#: Besides text/html, which nginx's charset, gzip and brotli filters always include.
COMPRESSED_TYPES = "text/plain application/xml"
_LOG_RE = re.compile(r'^(\d{3}) "(\S+) (\S+)(?: [^"]*)?"$')


def find_nginx() -> str | None:
    """The nginx binary on PATH or in the usual sbin directories, or None."""
    found = shutil.which("nginx")
    if found:
        return found
    for directory in NGINX_BIN_DIRS:
        candidate = Path(directory) / "nginx"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class NginxSite:
    """nginx serving ``root`` on 127.0.0.1:``port`` (a free one by default).

    Args:
        root: the directory served (``location / {}``; ``index.html`` for ``/``).
        tls: (certificate PEM path, key PEM path): serve HTTPS with HTTP/2.
        brotli: compress with the Debian brotli filter module.
        gzip: compress with nginx's gzip.
        server_extra: config text added inside the ``server`` block.
        port: the port (default: a free one).
        error_log_level: nginx's error_log level.
        start_timeout_s: how long nginx may take to listen.
    """

    def __init__(self, root: Path | str, *, tls: tuple[Path | str, Path | str] | None = None,
                 brotli: bool = False, gzip: bool = False, server_extra: str = "",
                 port: int | None = None, error_log_level: str = "warn",
                 start_timeout_s: float = 10.0) -> None:
        self.root = Path(root).resolve()
        self.tls = tls
        self.brotli = brotli
        self.gzip = gzip
        self.server_extra = server_extra
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.status_port = free_port(self.host)
        self._status_reads = 0
        self.error_log_level = error_log_level
        self.start_timeout_s = start_timeout_s
        self.binary = find_nginx()
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def base_url(self, host: str = "localhost") -> str:
        """``scheme://host:port`` (``localhost`` by default: the name the test CA's leaf names)."""
        return f"{self.scheme}://{host}:{self.port}"

    def url(self, path: str, host: str = "localhost") -> str:
        return self.base_url(host) + (path if path.startswith("/") else "/" + path)

    @property
    def work_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("nginx site not started")
        return Path(self._dir.name)

    @property
    def access_log(self) -> Path:
        return self.work_dir / "access.log"

    @property
    def error_log(self) -> Path:
        return self.work_dir / "error.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def config(self) -> str:
        """The whole nginx.conf for this site."""
        work = self.work_dir
        user = "user root;\n" if os.geteuid() == 0 else ""  # else workers become 'nobody'
        modules = f"load_module {BROTLI_MODULE};\n" if self.brotli else ""
        listen = f"listen {self.host}:{self.port}"
        tls = ""
        if self.tls:
            cert, key = (Path(p).resolve() for p in self.tls)
            listen += " ssl http2"
            tls = (f"        ssl_certificate {cert};\n"
                   f"        ssl_certificate_key {key};\n"
                   "        ssl_protocols TLSv1.2 TLSv1.3;\n")
        compress = ""
        if self.brotli:
            compress += f"    brotli on;\n    brotli_types {COMPRESSED_TYPES};\n"
        if self.gzip:
            compress += f"    gzip on;\n    gzip_types {COMPRESSED_TYPES};\n"
        temp = "".join(f"    {name}_temp_path {work / 'tmp' / name};\n"
                       for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        return (
            f"{modules}{user}"
            "worker_processes 1;\n"
            f"pid {work / 'nginx.pid'};\n"
            f"error_log {self.error_log} {self.error_log_level};\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            "    types { text/html html htm; application/xml xml; text/plain txt;\n"
            "            text/css css; application/javascript js; }\n"
            "    default_type application/octet-stream;\n"
            "    charset utf-8;\n"
            f"    charset_types {COMPRESSED_TYPES};\n"
            "    server_tokens off;\n"
            "    keepalive_requests 100000;\n"
            f"{temp}"
            "    log_format site '$status \"$request\"';\n"
            "    log_format timed '$msec $status $body_bytes_sent \"$request\"';\n"
            f"    access_log {self.access_log} site;\n"
            f"{compress}"
            "    server {\n"
            f"        {listen};\n"
            "        server_name _;\n"
            f"{tls}"
            f"        root {self.root};\n"
            "        location / { }\n"
            f"{self.server_extra}\n"
            "    }\n"
            "    server {\n"
            f"        listen {self.host}:{self.status_port};\n"
            "        access_log off;\n"
            "        location = /status { stub_status; }\n"
            "    }\n"
            "}\n")

    def start(self) -> NginxSite:
        if self.binary is None:
            raise RuntimeError("nginx not found: apt-get install -y nginx")
        if self.brotli and not BROTLI_MODULE.is_file():
            raise RuntimeError(f"{BROTLI_MODULE} missing: apt-get install -y "
                               "libnginx-mod-http-brotli-filter")
        self._dir = tempfile.TemporaryDirectory(prefix="nginx-site-")
        (self.work_dir / "tmp").mkdir()
        conf = self.work_dir / "nginx.conf"
        conf.write_text(self.config())
        self._proc = subprocess.Popen(
            [self.binary, "-p", str(self.work_dir), "-c", str(conf), "-e", str(self.error_log),
             "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                message = f"nginx exited with {self._proc.returncode}: {self._tail()}"
                self.stop()
                raise RuntimeError(message)
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    message = f"nginx did not listen within {self.start_timeout_s} s: {self._tail()}"
                    self.stop()
                    raise RuntimeError(message) from None
                time.sleep(0.05)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # fast shutdown of master and worker
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        directory, self._dir = self._dir, None
        if directory is not None:
            directory.cleanup()

    def __enter__(self) -> NginxSite:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def log_offset(self) -> int:
        """Where the access log ends now: pass it to :meth:`requests` to read what follows."""
        try:
            return self.access_log.stat().st_size
        except FileNotFoundError:
            return 0

    def requests(self, since: int = 0) -> list[tuple[str, int]]:
        """(path, status) of every request logged after byte ``since`` of the access log.

        nginx writes a line when the response is done, so a request still in flight is absent.
        """
        try:
            with self.access_log.open("r", encoding="utf-8", errors="replace") as handle:
                handle.seek(since)
                lines = handle.readlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            match = _LOG_RE.match(line.rstrip("\n"))
            if match is not None:
                found.append((match.group(3), int(match.group(1))))
        return found

    def await_requests(self, at_least: int = 1, since: int = 0,
                       timeout_s: float = 10.0) -> list[tuple[str, int]]:
        """``requests(since)`` once at least ``at_least`` lines are logged (or the timeout passed).

        nginx logs a request after the client already has the response, so a test that
        has just fetched a page must wait for the line rather than read the log at once.
        """
        deadline = time.monotonic() + timeout_s
        while len(found := self.requests(since)) < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    def connections(self) -> int:
        """TCP connections accepted on the site's port so far (the start-up probe included)."""
        with socket.create_connection((self.host, self.status_port), timeout=5) as sock:
            sock.sendall(b"GET /status HTTP/1.0\r\nHost: status\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        self._status_reads += 1
        match = re.search(rb"\n\s*(\d+) (\d+) (\d+)", answer)  # accepts handled requests
        if match is None:
            raise RuntimeError(f"nginx stub_status said {answer[:200]!r}")
        # Every read of the status is a connection too: ours so far are not the site's.
        return int(match.group(1)) - self._status_reads

    def _tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.error_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no error log)"
