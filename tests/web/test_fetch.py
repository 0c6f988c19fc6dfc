"""Fetcher against loopback servers only: the address guard, redirects, caps and timeouts.

Every URL fetched here is on 127.0.0.0/8 (the ``site`` fixture, a second TestSite on
127.0.0.2, or :class:`RawServer` below). Non-loopback addresses are tested as values in
tests/web/test_netguard.py, never connected to.

:class:`RawServer` writes bytes by hand for what TestSite cannot do (slow drip, a 3xx whose
body never ends) and records whether the client hung up before the server was done, so the
timeout tests assert on what the server saw rather than on wall-clock time.
"""

from __future__ import annotations

import ipaddress
import random
import resource
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable
from types import TracebackType

import pytest

from common.core.config import Settings
from common.core.errors import FetchError
from common.web.fetch import Fetcher, FetchResult
from common.web.netguard import parse_networks
from devtools.testsite import RequestRecord, TestSite

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
ONLY_127_0_0_1 = parse_networks("127.0.0.1/32")
MiB = 1024 * 1024


# -- helpers -----------------------------------------------------------------------------------


def _fetch_error(fetcher: Fetcher, url: str, **kwargs: object) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url, **kwargs)  # type: ignore[arg-type]
    return info.value


def _static(status: int, headers: dict[str, str], body: bytes = b"") -> Callable:
    def handler(_record: RequestRecord) -> tuple[int, dict[str, str], bytes]:
        return status, headers, body

    return handler


RawHandler = Callable[[socket.socket, "RawServer"], None]


class RawServer:
    """An HTTP server on a loopback address; ``handler(conn, server)`` answers each connection.

    The request head is read before the handler runs. A handler that hits a broken pipe or a
    reset (the client hung up) sets :attr:`client_hung_up`; one that returns normally sets
    :attr:`handler_finished`. Connections are served one at a time.
    """

    def __init__(self, handler: RawHandler, host: str = "127.0.0.1") -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"loopback only, not {host}")
        self.handler = handler
        self.host = host
        self.client_hung_up = threading.Event()
        self.handler_finished = threading.Event()
        self.request_heads: list[bytes] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="raw-server", daemon=True)

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    def wait_until_served(self, timeout_s: float = 10.0) -> None:
        """Wait until the handler finished or the client hung up, whichever comes first."""
        deadline = time.monotonic() + timeout_s
        while not (self.client_hung_up.is_set() or self.handler_finished.is_set()):
            if time.monotonic() > deadline:
                raise AssertionError("the raw server's handler did not end")
            time.sleep(0.02)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.request_heads.append(_read_head(conn))
                    self.handler(conn, self)
                    self.handler_finished.set()
                except (BrokenPipeError, ConnectionResetError):
                    self.client_hung_up.set()
                except OSError:
                    pass  # a timeout of the test server itself: the test's assertions decide


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _client_hangs_up_within(conn: socket.socket, timeout_s: float) -> bool:
    """Wait for the client to close its end (FIN or RST) without sending it anything."""
    conn.settimeout(timeout_s)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _drip(head: bytes, byte: bytes, count: int = 20, interval_s: float = 0.2) -> RawHandler:
    """Send ``head`` at once, then ``byte`` every ``interval_s``, ``count`` times (4 s)."""

    def handler(conn: socket.socket, _server: RawServer) -> None:
        conn.sendall(head)
        for _ in range(count):
            time.sleep(interval_s)
            conn.sendall(byte)

    return handler


# -- the address guard -------------------------------------------------------------------------


def test_loopback_site_is_refused_when_no_network_is_allowed(make_fetcher, site):
    fetcher = make_fetcher(fetch_allow_networks=())
    error = _fetch_error(fetcher, site.page_url(1))
    assert error.kind == "blocked" and not error.transient
    assert "127.0.0.1" in str(error)
    assert site.log == []


def test_loopback_site_is_fetched_when_127_0_0_0_8_is_allowed(make_fetcher, site):
    result = make_fetcher().fetch(site.page_url(1))
    assert isinstance(result, FetchResult)
    assert result.status == 200 and b"<title>Page 1</title>" in result.body
    assert result.final_url == site.page_url(1) and result.redirects == 0
    assert not result.truncated and result.skipped is None
    assert site.count("/page/1") == 1


def test_localhost_name_is_refused_when_nothing_is_allowed(make_fetcher, site):
    fetcher = make_fetcher(fetch_allow_networks=())
    error = _fetch_error(fetcher, f"http://localhost:{site.port}/page/1")
    assert error.kind == "blocked"
    assert "127.0.0.1" in str(error)  # the resolved address is what was refused
    assert site.log == []


def test_localhost_name_connects_to_the_allowed_address_it_resolves_to(make_fetcher, site):
    result = make_fetcher().fetch(f"http://localhost:{site.port}/page/2")
    assert result.status == 200
    [record] = site.log
    assert record.client[0] == "127.0.0.1" and record.host == f"localhost:{site.port}"


def test_allowing_one_loopback_host_refuses_its_neighbour(make_fetcher):
    with TestSite("127.0.0.2") as other:
        error = _fetch_error(make_fetcher(fetch_allow_networks=ONLY_127_0_0_1), other.page_url(1))
        assert error.kind == "blocked" and "127.0.0.2" in str(error)
        assert other.log == []


def test_guard_refusal_is_not_retried_inside_the_fetch(make_fetcher, site):
    fetcher = make_fetcher(fetch_allow_networks=())
    for _ in range(3):
        assert _fetch_error(fetcher, site.page_url(1)).kind == "blocked"
    assert site.log == []


# -- redirects ---------------------------------------------------------------------------------


def test_a_redirect_chain_is_followed_to_the_final_page(make_fetcher, site):
    result = make_fetcher().fetch(site.url("/redirect/3"))
    assert result.status == 200 and result.redirects == 3
    assert result.url == site.url("/redirect/3")
    assert result.final_url == site.page_url(1)
    assert b"<title>Page 1</title>" in result.body
    assert [r.path for r in site.log] == ["/redirect/3", "/redirect/2", "/redirect/1", "/page/1"]


def test_exactly_max_redirects_hops_are_followed(make_fetcher, site):
    result = make_fetcher(max_redirects=3).fetch(site.url("/redirect/3"))
    assert result.redirects == 3 and result.final_url == site.page_url(1)


def test_more_than_max_redirects_is_too_many_redirects(make_fetcher, site):
    error = _fetch_error(make_fetcher(max_redirects=2), site.url("/redirect/3"))
    assert error.kind == "too_many_redirects" and not error.transient
    assert [r.path for r in site.log] == ["/redirect/3", "/redirect/2", "/redirect/1"]


def test_a_redirect_loop_stops_after_max_redirects(make_fetcher, site):
    site.route("/t-fetch/loop", _static(302, {"Location": "/t-fetch/loop"}))
    error = _fetch_error(make_fetcher(), site.url("/t-fetch/loop"))
    assert error.kind == "too_many_redirects"
    assert site.count("/t-fetch/loop") == Settings().max_redirects + 1


def test_zero_max_redirects_refuses_the_first_redirect(make_fetcher, site):
    error = _fetch_error(make_fetcher(max_redirects=0), site.url("/redirect/1"))
    assert error.kind == "too_many_redirects"
    assert site.count("/page/1") == 0


@pytest.mark.parametrize("location", [
    "ftp://127.0.0.1/file.txt",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "data:text/html,<h1>hi</h1>",
    "gopher://127.0.0.1:70/_",
])
def test_a_redirect_to_a_non_http_url_is_bad_redirect(make_fetcher, site, location):
    site.route("/t-fetch/bad-redirect", _static(302, {"Location": location}))
    error = _fetch_error(make_fetcher(), site.url("/t-fetch/bad-redirect"))
    assert error.kind == "bad_redirect" and not error.transient
    assert [r.path for r in site.log] == ["/t-fetch/bad-redirect"]


def test_a_relative_redirect_with_a_fragment_is_resolved_without_the_fragment(make_fetcher,
                                                                              site):
    site.route("/t-fetch/rel/start", _static(301, {"Location": "../../page/2#top"}))
    result = make_fetcher().fetch(site.url("/t-fetch/rel/start"))
    assert result.final_url == site.page_url(2) and result.redirects == 1


def test_a_3xx_without_location_is_the_final_response(make_fetcher, site):
    site.route("/t-fetch/no-location", _static(302, {"Content-Type": "text/html"}, b"<p>x</p>"))
    result = make_fetcher().fetch(site.url("/t-fetch/no-location"))
    assert result.status == 302 and result.redirects == 0


def test_a_redirect_hop_to_a_loopback_host_that_is_not_allowed_is_refused(make_fetcher, site):
    with TestSite("127.0.0.2") as other:
        site.route("/t-fetch/hop-to-b", _static(302, {"Location": other.page_url(1)}))
        error = _fetch_error(make_fetcher(fetch_allow_networks=ONLY_127_0_0_1),
                             site.url("/t-fetch/hop-to-b"))
        assert error.kind == "blocked" and "127.0.0.2" in str(error)
        assert site.count("/t-fetch/hop-to-b") == 1
        assert other.log == []

        # The same chain with both hosts allowed reaches B: the refusal was the guard's.
        result = make_fetcher().fetch(site.url("/t-fetch/hop-to-b"))
        assert result.final_url == other.page_url(1) and result.redirects == 1
        assert [r.path for r in other.log] == ["/page/1"]


def test_a_redirect_hop_to_a_name_is_guarded_on_the_address_it_resolves_to(make_fetcher, site):
    # Only ::1 is allowed; the first hop is on [::1], the second names "localhost", which
    # resolves to 127.0.0.1 (the session site) and must be refused there.
    def to_localhost(conn: socket.socket, _server: RawServer) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://localhost:%d/page/3\r\n"
                     b"Content-Length: 0\r\n\r\n" % site.port)

    try:
        raw = RawServer(to_localhost, host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with raw:
        fetcher = make_fetcher(fetch_allow_networks=parse_networks("::1/128"))
        error = _fetch_error(fetcher, raw.url("/start"))
        assert error.kind == "blocked" and "127.0.0.1" in str(error)
        assert len(raw.request_heads) == 1 and raw.request_heads[0].startswith(b"GET /start ")
    assert site.log == []


def test_the_body_of_a_redirect_is_not_read(make_fetcher, site):
    # A 302 announcing 20 MiB sends 64 KiB and then waits: a client that follows the
    # Location without reading the body hangs up; one that reads it would wait for the rest.
    def huge_redirect(conn: socket.socket, server: RawServer) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + site.page_url(1).encode()
                     + b"\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % (20 * MiB))
        conn.sendall(b"x" * 65536)
        if _client_hangs_up_within(conn, 3.0):
            server.client_hung_up.set()

    with RawServer(huge_redirect) as raw:
        result = make_fetcher(read_timeout_s=10).fetch(raw.url("/"))
        assert result.final_url == site.page_url(1) and result.redirects == 1
        raw.wait_until_served()
        assert raw.client_hung_up.is_set(), "the client read (or waited for) the 3xx body"


# -- caps --------------------------------------------------------------------------------------


def test_a_body_beyond_max_body_bytes_is_truncated_at_the_cap(make_fetcher, site):
    result = make_fetcher(max_body_bytes=100_000).fetch(site.url("/big/200"))
    assert result.status == 200 and result.truncated
    assert len(result.body) == 100_000
    assert result.body.startswith(b"<!DOCTYPE html>")


def test_a_body_of_exactly_max_body_bytes_is_not_truncated(make_fetcher, site):
    result = make_fetcher(max_body_bytes=64 * 1024).fetch(site.url("/big/64"))
    assert not result.truncated and len(result.body) == 64 * 1024


def _bomb(wbits: int, decoded_bytes: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b"\0" * MiB
    parts = [compressor.compress(block) for _ in range(decoded_bytes // MiB)]
    return b"".join(parts) + compressor.flush()


@pytest.mark.parametrize("encoding, wbits", [("gzip", 31), ("deflate", 15)])
def test_a_compression_bomb_is_cut_at_the_cap_with_bounded_memory(make_fetcher, site,
                                                                  encoding, wbits):
    bomb = _bomb(wbits, 200 * MiB)
    assert len(bomb) < 300 * 1024  # ~200 KB on the wire for 200 MB decoded
    site.route(f"/t-fetch/bomb-{encoding}",
               _static(200, {"Content-Type": "text/html", "Content-Encoding": encoding}, bomb))
    fetcher = make_fetcher(max_body_bytes=MiB)

    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        result = fetcher.fetch(site.url(f"/t-fetch/bomb-{encoding}"))
        _current, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib

    assert result.truncated and len(result.body) == MiB and result.body == b"\0" * MiB
    assert peak_bytes < 32 * MiB, f"peak Python allocations {peak_bytes / MiB:.0f} MiB"
    assert rss_growth_kib < 100 * 1024, f"max RSS grew {rss_growth_kib / 1024:.0f} MiB"


def test_headers_beyond_max_header_bytes_are_headers_too_large(make_fetcher, site):
    filler = {f"X-Filler-{i:02d}": "a" * 2000 for i in range(50)}  # ~100 KB, 50 headers
    site.route("/t-fetch/fat-headers", _static(200, {"Content-Type": "text/html", **filler},
                                               b"<p>hi</p>"))
    error = _fetch_error(make_fetcher(max_header_bytes=16384), site.url("/t-fetch/fat-headers"))
    assert error.kind == "headers_too_large" and not error.transient


def test_headers_under_max_header_bytes_are_accepted(make_fetcher, site):
    filler = {f"X-Filler-{i}": "a" * 2000 for i in range(5)}  # ~10 KB
    site.route("/t-fetch/some-headers", _static(200, {"Content-Type": "text/html", **filler},
                                                b"<p>hi</p>"))
    result = make_fetcher(max_header_bytes=16384).fetch(site.url("/t-fetch/some-headers"))
    assert result.status == 200 and result.body == b"<p>hi</p>"
    assert result.headers["x-filler-0"] == "a" * 2000


def test_a_redirect_with_oversized_headers_is_not_followed(make_fetcher, site):
    filler = {f"X-Filler-{i:02d}": "a" * 2000 for i in range(20)}
    site.route("/t-fetch/fat-redirect", _static(302, {"Location": "/page/1", **filler}))
    error = _fetch_error(make_fetcher(max_header_bytes=16384), site.url("/t-fetch/fat-redirect"))
    assert error.kind == "headers_too_large"
    assert site.count("/page/1") == 0


def test_a_header_line_longer_than_max_header_bytes_is_headers_too_large(make_fetcher, site):
    # 70,000 bytes is over the default MAX_HEADER_BYTES (65,536) and also over http.client's
    # own 64 KiB line limit, so the cap must be enforced however the client library reports it.
    site.route("/t-fetch/long-header-line",
               _static(200, {"Content-Type": "text/html", "X-Long": "a" * 70_000}, b"<p>hi</p>"))
    fetcher = make_fetcher()
    assert fetcher.settings.max_header_bytes < 70_000
    error = _fetch_error(fetcher, site.url("/t-fetch/long-header-line"))
    assert error.kind == "headers_too_large", f"{error.kind}: {error}"


# -- the total timeout against slow-drip servers -----------------------------------------------

DRIP_TIMEOUTS = {"fetch_total_timeout_s": 1.0, "read_timeout_s": 2.0}


def test_a_slow_drip_chunked_body_times_out_at_the_total_timeout(make_fetcher):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    with RawServer(_drip(head, b"1\r\nx\r\n")) as raw:
        error = _fetch_error(make_fetcher(**DRIP_TIMEOUTS), raw.url("/"))
        assert error.kind == "timeout" and error.transient
        # 20 bytes at 0.2 s take 4 s; the client gave up first (at about 1 s).
        raw.wait_until_served()
        assert raw.client_hung_up.is_set() and not raw.handler_finished.is_set()


def test_a_slow_drip_body_with_content_length_times_out_at_the_total_timeout(make_fetcher):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
            b"Content-Length: 100000\r\n\r\n")
    with RawServer(_drip(head, b"x")) as raw:
        error = _fetch_error(make_fetcher(**DRIP_TIMEOUTS), raw.url("/"))
        raw.wait_until_served()
        assert raw.client_hung_up.is_set() and not raw.handler_finished.is_set(), (
            "the client kept reading the drip past FETCH_TOTAL_TIMEOUT_S")
        assert error.kind == "timeout", f"{error.kind}: {error}"


def test_slow_drip_headers_time_out_at_the_total_timeout(make_fetcher):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Drip: "

    def drip_headers(conn: socket.socket, server: RawServer) -> None:
        _drip(head, b"a")(conn, server)
        conn.sendall(b"\r\nContent-Length: 2\r\n\r\nhi")

    with RawServer(drip_headers) as raw:
        error = _fetch_error(make_fetcher(**DRIP_TIMEOUTS), raw.url("/"))
        raw.wait_until_served()
        assert raw.client_hung_up.is_set() and not raw.handler_finished.is_set(), (
            "the client waited for the dripped headers past FETCH_TOTAL_TIMEOUT_S")
        assert error.kind == "timeout"


# -- content types and other outcomes ----------------------------------------------------------


def test_a_non_html_content_type_is_recorded_without_reading_the_body(make_fetcher, site):
    result = make_fetcher().fetch(site.url("/binary"))
    assert result.status == 200 and result.skipped == "content_type"
    assert result.content_type == "application/octet-stream"
    assert result.body == b"" and not result.truncated


def test_accept_any_type_reads_a_non_html_body(make_fetcher, site):
    result = make_fetcher().fetch(site.url("/binary"), accept_any_type=True)
    assert result.skipped is None and result.body == random.Random(0).randbytes(4096)


def test_content_type_matching_ignores_case_and_parameters(make_fetcher, site):
    site.route("/t-fetch/shouty-type",
               _static(200, {"Content-Type": "Text/HTML ; Charset=UTF-8"}, b"<p>hi</p>"))
    result = make_fetcher().fetch(site.url("/t-fetch/shouty-type"))
    assert result.skipped is None and result.body == b"<p>hi</p>"


def test_a_missing_content_type_is_read_for_sniffing(make_fetcher, site):
    site.route("/t-fetch/no-type", _static(200, {}, b"<html><title>untyped</title></html>"))
    result = make_fetcher().fetch(site.url("/t-fetch/no-type"))
    assert result.content_type is None and result.skipped is None
    assert result.body == b"<html><title>untyped</title></html>"


def test_an_error_status_is_a_result_not_an_exception(make_fetcher, site):
    result = make_fetcher().fetch(site.url("/status/404"))
    assert result.status == 404 and b"status 404" in result.body


def test_a_refused_connection_is_a_transient_connection_error(make_fetcher):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connecting is refused
        error = _fetch_error(make_fetcher(), f"http://127.0.0.1:{sock.getsockname()[1]}/")
    finally:
        sock.close()
    assert error.kind == "connection" and error.transient


# -- content encodings (decoded by the fleet, not libcurl) -------------------------------------


def _deflate(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize("encoding, body", [
    ("gzip", _deflate(b"<p>one</p>", 31) + _deflate(b"<p>two</p>", 31)),  # two members
    ("x-gzip", _deflate(b"<p>one</p><p>two</p>", 31)),
    ("deflate", _deflate(b"<p>one</p><p>two</p>", 15)),  # zlib-wrapped, as the RFC says
    ("deflate", _deflate(b"<p>one</p><p>two</p>", -15)),  # raw, as many servers send it
])
def test_gzip_and_deflate_bodies_are_decoded_whole(make_fetcher, site, encoding, body):
    site.route("/t-fetch/encoded", _static(200, {"Content-Type": "text/html",
                                                 "Content-Encoding": encoding}, body))
    result = make_fetcher().fetch(site.url("/t-fetch/encoded"))
    assert result.body == b"<p>one</p><p>two</p>" and not result.truncated
    [record] = site.log
    assert record.headers.get("Accept-Encoding") == "gzip, deflate, br, zstd"


@pytest.mark.parametrize("encoding, body, message", [
    ("gzip", b"\x1f\x8b\x08\x00 certainly not gzip", "bad gzip body"),
    ("br", b"\x0b\x02\x80<p>x</p>\x03\xff\xff", "bad br body"),
    ("compress", b"\x1f\x9d\x90 lzw", "unsupported Content-Encoding 'compress'"),
])
def test_an_undecodable_body_is_an_invalid_fetch(make_fetcher, site, encoding, body, message):
    site.route("/t-fetch/undecodable", _static(200, {"Content-Type": "text/html",
                                                     "Content-Encoding": encoding}, body))
    error = _fetch_error(make_fetcher(), site.url("/t-fetch/undecodable"))
    assert error.kind == "invalid" and not error.transient and message in str(error)


def test_keep_alive_connections_are_reused_between_fetches(make_fetcher, site):
    fetcher = make_fetcher()
    for n in range(1, 6):
        assert fetcher.fetch(site.page_url(n)).status == 200
    ports = {record.client[1] for record in site.log}
    assert len(site.log) == 5 and len(ports) == 1, ports


# -- malformed responses -------------------------------------------------------------------------


def _answer(head: bytes) -> RawHandler:
    def handler(conn: socket.socket, _server: RawServer) -> None:
        conn.sendall(head + b"Content-Length: 2\r\nConnection: close\r\n\r\nok")

    return handler


@pytest.mark.parametrize("bad_line", [b"X-Bad: a\x00b\r\n", b"X-Bad: a\rb\r\n"],
                         ids=["nul", "bare-cr"])
def test_a_header_with_a_nul_or_bare_cr_is_a_permanent_invalid_response(make_fetcher,
                                                                         bad_line):
    with RawServer(_answer(b"HTTP/1.1 200 OK\r\n" + bad_line)) as raw:
        error = _fetch_error(make_fetcher(), raw.url("/weird"))
    assert error.kind == "invalid" and not error.transient, error
    assert "curl error 8" in str(error)
