"""A deterministic test web site on a loopback address, for tests and the local demo.

Routes (``N``, ``CODE``, ``SECONDS``, ``KB`` are numbers; a query string is ignored)::

    /                     index linking to every /page/N
    /page/N               HTML page N (1..pages) with links_per_page links to other pages
    /status/CODE          that status with a small HTML body
    /slow/SECONDS         sleeps (at most 30 s), then a page
    /redirect/N           302 chain: /redirect/N -> /redirect/N-1 ... -> /page/1 (N hops)
    /latin1               ISO-8859-1 bytes, charset only in a <meta> tag
    /nocharset            UTF-8 bytes, no charset anywhere
    /binary               application/octet-stream, deterministic bytes
    /robots.txt           the robots_txt given to the constructor (404 when None)
    /retry-after/SECONDS  429 with a Retry-After header
    /busy/CODE[/SECONDS]  CODE (429, 503, ...), with a Retry-After header when SECONDS is given
    /flaky/KEY/N          503 for the first N requests for KEY (per site), then 200
    /big/KB               an HTML page of exactly KB * 1024 bytes
    /encoded/ENC/N        /page/N sent with Content-Encoding ENC (gzip, deflate, br, zstd;
                          identity: none), whatever the request's Accept-Encoding

Extra routes: ``site.route("/path", handler)``; ``handler(request)`` gets the
:class:`RequestRecord` and returns ``(status, headers, body_bytes)``.

A whole site pushing back: ``site.refuse_next(n, 429, retry_after_s=None)`` answers the next
``n`` requests (any path but /robots.txt) with that status; ``site.latency_s`` (settable while
serving) slows every answer down.

Every request is logged (:attr:`TestSite.log`) before it is answered, and again with the time
its answer was written (:attr:`TestSite.answered`): a request is in flight between the two.
POST is served like GET (custom routes usually); its body is in :attr:`RequestRecord.body`.
"""

from __future__ import annotations

import contextlib
import html
import ipaddress
import logging
import random
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import brotli
import zstandard

from devtools.services.base import Managed

logger = logging.getLogger(__name__)

MAX_SLOW_S = 30.0
MAX_BIG_KB = 100 * 1024

Response = tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class RequestRecord:
    """One request as the site saw it.

    Attributes:
        monotonic_s: ``time.monotonic()`` on arrival (for rate checks).
        wall_time_s: ``time.time()`` on arrival.
        method: HTTP method.
        path: request target as sent, query string included.
        host: the Host header ("" when absent).
        client: (address, port) of the client.
        headers: all request headers (last value wins).
        header_lines: every header line as sent, repeats included.
        body: the request body (a POST's; empty for GET and HEAD).
    """

    monotonic_s: float
    wall_time_s: float
    method: str
    path: str
    host: str
    client: tuple[str, int]
    headers: dict[str, str] = field(default_factory=dict)
    header_lines: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def user_agent(self) -> str:
        return self.headers.get("User-Agent", "")


Handler = Callable[[RequestRecord], Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        # Clients that hang up mid-response (timeouts, size limits) are expected here.
        logger.debug("test site: error serving %s", client_address, exc_info=True)


class TestSite(Managed):
    """A threaded HTTP server with deterministic pages and a request log.

    Args:
        host: a 127.x.y.z address to bind.
        port: TCP port (0: a free one).
        pages: number of /page/N pages.
        links_per_page: links on each page to other pages.
        robots_txt: body of /robots.txt; None answers 404.
        latency_s: delay added before every response.
    """

    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        pages: int = 200,
        links_per_page: int = 10,
        robots_txt: str | None = None,
        latency_s: float = 0.0,
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"test sites bind loopback addresses only, not {host}")
        if pages < 1:
            raise ValueError("pages must be >= 1")
        self.host = host
        self.port = port
        self.pages = pages
        self.links_per_page = links_per_page
        self.robots_txt = robots_txt
        self.latency_s = latency_s
        self._routes: dict[str, Handler] = {}
        self._log: list[RequestRecord] = []
        self._answered: list[tuple[RequestRecord, float]] = []
        self._flaky_counts: dict[str, int] = {}
        self._refusals: list[Response] = []
        self.refused: list[RequestRecord] = []  # the requests refuse_next answered
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> TestSite:
        """Bind and serve in a daemon thread."""
        if self._server is not None:
            raise RuntimeError(f"{self.base_url} is already serving")
        self._server = _Server((self.host, self.port), _make_handler(self))
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name=f"testsite-{self.host}:{self.port}", daemon=True)
        self._thread.start()
        logger.debug("test site serving %s", self.base_url)
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket. Safe to call twice."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    # -- addresses -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, path: str = "/") -> str:
        """Absolute URL of ``path`` on this site."""
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def page_url(self, n: int) -> str:
        return self.url(f"/page/{n}")

    # -- custom routes and the request log -------------------------------------------------

    def route(self, path: str, handler: Handler) -> None:
        """Serve ``path`` (exact match, query ignored) with ``handler``; wins over built-ins."""
        with self._lock:
            self._routes[path] = handler

    def routes(self) -> dict[str, Handler]:
        """The custom routes now, for :meth:`restore_routes` (a test's routes undone)."""
        with self._lock:
            return dict(self._routes)

    def restore_routes(self, routes: dict[str, Handler]) -> None:
        """Serve exactly ``routes`` (from :meth:`routes`) besides the built-ins again."""
        with self._lock:
            self._routes = dict(routes)

    @property
    def log(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    @property
    def answered(self) -> list[tuple[RequestRecord, float]]:
        """Each answered request with ``time.monotonic()`` once its answer was written,
        oldest answer first (a request cut off mid-answer is not in it)."""
        with self._lock:
            return list(self._answered)

    def requests_for(self, path_prefix: str | None = None) -> list[RequestRecord]:
        """Logged requests whose path starts with ``path_prefix`` (all when None)."""
        with self._lock:
            return [r for r in self._log if path_prefix is None or r.path.startswith(path_prefix)]

    def count(self, path: str) -> int:
        """How many requests asked for exactly ``path``."""
        with self._lock:
            return sum(1 for r in self._log if r.path == path)

    def clear_log(self) -> None:
        """Forget logged requests and /flaky counters."""
        with self._lock:
            self._log.clear()
            self._answered.clear()
            self._flaky_counts.clear()

    def refuse_next(self, count: int, status: int = 429,
                    retry_after_s: float | None = None) -> None:
        """Answer the next ``count`` requests (any path but /robots.txt) with ``status``, and a
        ``Retry-After: retry_after_s`` header when given: the whole site refusing for a while."""
        headers = {"Content-Type": "text/html; charset=utf-8"}
        if retry_after_s is not None:
            headers["Retry-After"] = f"{retry_after_s:g}"
        with self._lock:
            self._refusals = [(status, headers, _small_page(status, "busy"))] * count

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._log.append(record)

    def _record_answer(self, record: RequestRecord) -> None:
        with self._lock:
            self._answered.append((record, time.monotonic()))

    def _flaky_hit(self, key: str) -> int:
        with self._lock:
            self._flaky_counts[key] = self._flaky_counts.get(key, 0) + 1
            return self._flaky_counts[key]

    # -- content ---------------------------------------------------------------------------

    def links_of(self, n: int) -> list[int]:
        """Page numbers that /page/N links to (deterministic, never N itself)."""
        if self.pages == 1:
            return []
        rng = random.Random(n)
        count = min(self.links_per_page, self.pages - 1)
        others = [m for m in range(1, self.pages + 1) if m != n]
        return sorted(rng.sample(others, count))

    def page_html(self, n: int) -> str:
        """The HTML of /page/N."""
        items = []
        for i, m in enumerate(self.links_of(n)):
            # Mix of absolute, root-relative and document-relative links to the same kind
            # of target, so link extraction must resolve all three.
            href = (self.page_url(m), f"/page/{m}", f"{m}")[i % 3]
            items.append(f'<li><a href="{html.escape(href)}">Page {m}</a></li>')
        return _document(
            title=f"Page {n}",
            description=f"Test page {n} of {self.pages}.",
            canonical=self.page_url(n),
            body=(f"<h1>Page {n}</h1>\n<p>{_sentence(n)}</p>\n"
                  f"<ul>\n{chr(10).join(items)}\n</ul>\n<p><a href=\"/\">Index</a></p>"),
        )

    def respond(self, record: RequestRecord) -> Response:
        """The response for one request (routing table)."""
        path = urlsplit(record.path).path
        with self._lock:
            if self._refusals and path != "/robots.txt":
                self.refused.append(record)
                return self._refusals.pop()
            custom = self._routes.get(path)
        if custom is not None:
            return custom(record)
        return self._builtin(path)

    def _builtin(self, path: str) -> Response:
        if path == "/":
            links = "\n".join(f'<li><a href="/page/{n}">Page {n}</a></li>'
                              for n in range(1, self.pages + 1))
            return _html(200, _document("Index", f"Index of {self.pages} test pages.",
                                        self.url("/"), f"<h1>Index</h1>\n<ul>\n{links}\n</ul>"))
        if path == "/robots.txt":
            if self.robots_txt is None:
                return _html(404, _small_page(404, "no robots.txt"))
            return 200, {"Content-Type": "text/plain; charset=utf-8"}, self.robots_txt.encode()
        if path == "/latin1":
            doc = ('<!DOCTYPE html>\n<html lang="fr"><head>'
                   '<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
                   "<title>Café Latin-1</title></head>\n"
                   "<body><p>Un café crème à côté, s'il vous plaît.</p></body></html>\n")
            return 200, {"Content-Type": "text/html"}, doc.encode("iso-8859-1")
        if path == "/nocharset":
            doc = ("<!DOCTYPE html>\n<html><head><title>Naïve résumé</title></head>\n"
                   "<body><p>UTF-8 with no declared encoding: naïve café — “quotes” 日本語</p>"
                   "</body></html>\n")
            return 200, {"Content-Type": "text/html"}, doc.encode("utf-8")
        if path == "/binary":
            return 200, {"Content-Type": "application/octet-stream"}, random.Random(0).randbytes(4096)

        match = _ROUTE_RE.fullmatch(path)
        if match is None:
            return _html(404, _small_page(404, "not found"))
        kind, arg, rest = match.group("kind"), match.group("arg"), match.group("rest")
        try:
            if kind == "page" and rest is None:
                n = int(arg)
                if 1 <= n <= self.pages:
                    return _html(200, self.page_html(n))
            elif kind == "status" and rest is None:
                code = int(arg)
                if 200 <= code <= 599:
                    body = b"" if code in (204, 304) else _small_page(code, f"status {code}")
                    return code, {"Content-Type": "text/html; charset=utf-8"}, body
            elif kind == "slow" and rest is None:
                delay_s = min(float(arg), MAX_SLOW_S)
                time.sleep(max(delay_s, 0.0))
                return _html(200, _document(f"Slow {delay_s:g}", "A slow page.",
                                            self.url(path), f"<p>Waited {delay_s:g} s.</p>"))
            elif kind == "redirect" and rest is None:
                hops = int(arg)
                target = f"/redirect/{hops - 1}" if hops > 1 else "/page/1"
                return 302, {"Location": target, "Content-Type": "text/html; charset=utf-8"}, \
                    _small_page(302, f"see {target}")
            elif kind == "retry-after" and rest is None:
                seconds = int(arg)
                return 429, {"Retry-After": str(seconds),
                             "Content-Type": "text/html; charset=utf-8"}, \
                    _small_page(429, "too many requests")
            elif kind == "busy":
                headers = {"Content-Type": "text/html; charset=utf-8"}
                if rest is not None:
                    headers["Retry-After"] = str(int(rest))
                return int(arg), headers, _small_page(int(arg), "busy")
            elif kind == "flaky" and rest is not None:
                failures = int(rest)
                if self._flaky_hit(arg) <= failures:
                    return _html(503, _small_page(503, f"flaky {arg}: try again"))
                return _html(200, _document(f"Flaky {arg}", "Recovered.", self.url(path),
                                            f"<p>{arg} works now.</p>"))
            elif kind == "encoded" and rest is not None and arg in ENCODERS:
                n = int(rest)
                if 1 <= n <= self.pages:
                    status, headers, body = _html(200, self.page_html(n))
                    if arg != "identity":
                        headers["Content-Encoding"] = arg
                    return status, headers, ENCODERS[arg](body)
            elif kind == "big" and rest is None:
                kb = int(arg)
                if 0 < kb <= MAX_BIG_KB:
                    return _html(200, _big_page(kb * 1024))
        except ValueError:
            return _html(400, _small_page(400, "bad number"))
        return _html(404, _small_page(404, "not found"))


_ROUTE_RE = re.compile(
    r"/(?P<kind>page|status|slow|redirect|retry-after|busy|flaky|big|encoded)/(?P<arg>[^/]+)"
    r"(?:/(?P<rest>[^/]+))?"
)



def _deflate(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


#: /encoded/ENC/N's encoders, by Content-Encoding.
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "identity": bytes,
    "gzip": lambda data: _deflate(data, zlib.MAX_WBITS | 16),
    "deflate": lambda data: _deflate(data, zlib.MAX_WBITS),
    "br": lambda data: brotli.compress(data, quality=5),
    "zstd": lambda data: zstandard.ZstdCompressor(level=3).compress(data),
}

_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def _sentence(n: int, words: int = 40) -> str:
    rng = random.Random(-n)
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _document(title: str, description: str, canonical: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        f'<meta name="description" content="{html.escape(description)}">\n'
        f'<link rel="canonical" href="{html.escape(canonical)}">\n'
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _small_page(code: int, message: str) -> bytes:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><title>{code}</title></head>"
            f"<body><p>{html.escape(message)}</p></body></html>\n").encode()


def _big_page(size_bytes: int) -> str:
    head = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            "<title>Big page</title></head><body>\n")
    tail = "</body></html>\n"
    filler_len = max(size_bytes - len(head) - len(tail), 0)
    line = "<p>" + " ".join(_WORDS) + "</p>\n"
    # Whole paragraphs, then spaces for the remainder, so the page stays valid HTML.
    filler = line * (filler_len // len(line)) + " " * (filler_len % len(line))
    return head + filler + tail


def _html(status: int, body: str | bytes) -> Response:
    data = body.encode("utf-8") if isinstance(body, str) else body
    return status, {"Content-Type": "text/html; charset=utf-8"}, data


def _make_handler(site: TestSite) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fleet-testsite/1"
        timeout = 30  # idle keep-alive connections are closed after this

        def _serve(self, with_body: bool, request_body: bytes = b"") -> None:
            record = RequestRecord(
                monotonic_s=time.monotonic(), wall_time_s=time.time(), method=self.command,
                path=self.path, host=self.headers.get("Host", ""),
                client=(self.client_address[0], int(self.client_address[1])),
                headers=dict(self.headers.items()), header_lines=list(self.headers.items()),
                body=request_body,
            )
            site._record(record)
            if site.latency_s > 0:
                time.sleep(site.latency_s)
            try:
                status, headers, body = site.respond(record)
            except Exception:  # noqa: BLE001 - a broken custom route must still answer
                logger.exception("test site: route for %s failed", record.path)
                status, headers, body = _html(500, _small_page(500, "handler failed"))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body and body:
                self.wfile.write(body)
            self.wfile.flush()
            site._record_answer(record)

        def do_GET(self) -> None:
            self._serve(with_body=True)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self._serve(with_body=True, request_body=self.rfile.read(length) if length else b"")

        def do_HEAD(self) -> None:
            self._serve(with_body=False)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the request log replaces the access log

    return _Handler


def start_sites(n: int, first_host: str = "127.0.0.1", **kwargs: object) -> list[TestSite]:
    """Start ``n`` sites on consecutive loopback addresses (127.0.0.1, 127.0.0.2, ...).

    Linux routes all of 127.0.0.0/8 to ``lo``, so each site is a distinct host for
    per-domain rate limits. ``kwargs`` go to :class:`TestSite`.
    """
    first = ipaddress.IPv4Address(first_host)
    sites: list[TestSite] = []
    try:
        for i in range(n):
            host = first + i
            if not host.is_loopback:
                raise ValueError(f"{host} is outside 127.0.0.0/8")
            sites.append(TestSite(str(host), **kwargs).start())  # type: ignore[arg-type]
    except BaseException:
        for site in sites:
            site.stop()
        raise
    return sites


@contextlib.contextmanager
def running_sites(n: int, first_host: str = "127.0.0.1",
                  **kwargs: object) -> Iterator[list[TestSite]]:
    """:func:`start_sites`, stopped again when the block ends."""
    sites = start_sites(n, first_host, **kwargs)
    try:
        yield sites
    finally:
        for site in sites:
            site.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.testsite``: serve test sites until ^C (for the local demo)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=1, help="number of hosts (127.0.0.1 up)")
    parser.add_argument("--first-host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="same port on every host (0: free)")
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--links-per-page", type=int, default=10)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--robots-txt", default=None, help="body of /robots.txt (default: 404)")
    parser.add_argument("--log-to", default=None, metavar="FILE",
                        help="on exit, write every site's request log to FILE as JSON lines "
                             "(host, path, monotonic_s: devtools/site_process.py reads it)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with running_sites(args.sites, args.first_host, port=args.port, pages=args.pages,
                       links_per_page=args.links_per_page, latency_s=args.latency_s,
                       robots_txt=args.robots_txt) as sites:
        for site in sites:
            print(site.base_url, flush=True)
        while not stop.wait(0.5):
            pass
    if args.log_to:  # the sites have stopped: their logs are whole
        _write_logs(sites, args.log_to)
    return 0


def _write_logs(sites: list[TestSite], path: str) -> None:
    """Every site's request log as JSON lines, written whole then renamed into place."""
    import json
    import os

    with open(path + ".part", "w", encoding="utf-8") as out:
        for site in sites:
            for record in site.log:
                out.write(json.dumps({"host": site.host, "path": record.path,
                                      "monotonic_s": record.monotonic_s}) + "\n")
    os.replace(path + ".part", path)


if __name__ == "__main__":
    raise SystemExit(main())
