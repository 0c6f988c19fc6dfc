"""The media downloader against Debian's nginx serving a catalogue and big files on loopback
(devtools/media_site.py), and a few-line socket server for the breaks nginx does not make.

Every address is 127.0.0.1 (``localhost``); the one private address a redirect names is refused
by the address guard before any connection is attempted.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.media_types import parse_caps
from common.media.download import Download, Downloader
from common.web.multi import FetchLoop
from devtools.media_site import HUGE_BYTES, MediaSite
from tests.helpers import in_fetch_loop, wait_for

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
CAPS = "image/*=1MB,application/pdf=10MB,video/*=8MB,*=32MB"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MediaSite]:
    with MediaSite(tmp_path_factory.mktemp("media")) as served:
        yield served


@pytest.fixture
def make_downloader() -> Iterator[Callable[..., Downloader]]:
    made: list[Downloader] = []

    def make(**overrides: object) -> Downloader:
        settings = Settings().with_overrides(**{"fetch_allow_networks": LOOPBACK,
                                                "media_max_bytes": parse_caps(CAPS),
                                                **overrides})
        made.append(Downloader(settings))
        return made[-1]

    yield make
    for downloader in made:
        downloader.close()


def _error(call: Callable[[], object]) -> FetchError:
    with pytest.raises(FetchError) as info:
        call()
    return info.value


@pytest.mark.parametrize("where", ["thread", "fetch loop"])
def test_a_png_and_a_pdf_come_back_with_their_hash_size_and_type_in_a_spool_file(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader],
        where: str) -> None:
    downloader = make_downloader()
    assets = site.assets()
    loop = FetchLoop() if where == "fetch loop" else None
    try:
        for path, types in (("/images/p2-0.png", ("image/*",)),
                            ("/manuals/p1.pdf", ("application/pdf",))):
            url = site.url(path)
            call = downloader.download
            got: Download = call(url, types=types, spool_dir=spool) if loop is None else \
                in_fetch_loop(loop, call, url, types=types, spool_dir=spool)
            sha, size, media_type = assets[url]
            assert (got.status, got.sha256, got.size, got.media_type) == (200, sha, size,
                                                                        media_type)
            assert got.path is not None and got.path.parent == spool
            assert got.path.read_bytes() == site.file(path).read_bytes()
            assert got.resumed == 0 and got.final_url == url and got.sent_at is not None
            got.path.unlink()
    finally:
        if loop is not None:
            loop.close()


def test_an_image_refused_by_type_reads_no_body_and_leaves_no_spool_file(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    error = _error(lambda: downloader.download(site.url("/images/p0-0.png"),
                                               types=("application/pdf",), spool_dir=spool))
    assert error.kind == "type_refused" and "image/png" in str(error)
    assert not error.transient
    offset = site.log_offset()
    error = _error(lambda: downloader.download(site.url("/big/large.bin"),
                                               types=("image/*",), spool_dir=spool))
    assert error.kind == "type_refused"
    assert list(spool.iterdir()) == []
    # nginx logs a request once it is done with it: the PNG's line may come after the offset.
    assert wait_for(lambda: any(p == "/big/large.bin" for p, _s, _b in site.requests(offset)), 10)
    [(status, sent)] = [(s, b) for p, s, b in site.requests(offset) if p == "/big/large.bin"]
    assert status == 200
    assert sent < site.large_bytes // 2  # the connection closed before most of the body left


def test_the_sparse_2_gb_file_is_refused_by_its_content_length_before_the_body(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    offset = site.log_offset()
    error = _error(lambda: downloader.download(site.url("/big/huge.mp4"), types=("video/*",),
                                               spool_dir=spool))
    assert error.kind == "too_large" and str(HUGE_BYTES) in str(error)
    assert list(spool.iterdir()) == []
    assert wait_for(lambda: any(p == "/big/huge.mp4" for p, _s, _b in site.requests(offset)), 10)
    [(status, sent)] = [(s, b) for p, s, b in site.requests(offset) if p == "/big/huge.mp4"]
    assert status == 200
    assert sent < 64 * 1024 * 1024  # what nginx pushed into the socket buffers, of 2 GiB



def test_a_jobs_own_caps_replace_the_settings_caps(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()  # MEDIA_MAX_BYTES *=32MB
    error = _error(lambda: downloader.download(site.url("/big/medium.bin"), types=("*",),
                                               spool_dir=spool, caps=parse_caps("*=1MB")))
    assert error.kind == "too_large" and "cap of 1000000" in str(error)
    got = downloader.download(site.url("/big/large.bin"), types=("*",), spool_dir=spool,
                              caps=parse_caps("*=4GB"))
    assert got.size == site.large_bytes and got.path is not None
    got.path.unlink()


def test_a_body_without_content_length_is_cut_at_the_cap_with_memory_flat(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    tracemalloc.start()
    try:
        error = _error(lambda: downloader.download(site.url("/stream/huge.mp4"),
                                                   types=("video/*",), spool_dir=spool))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.kind == "too_large" and "grew past its cap" in str(error)
    assert peak < 1024 * 1024  # the cap is 8 MB, the body 2 GiB: never held in memory
    assert list(spool.iterdir()) == []


def test_a_transfer_cut_midway_is_resumed_with_a_range_request(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    offset = site.log_offset()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["done"] = downloader.download(site.url("/slow/medium.bin"), types=("*",),
                                              spool_dir=spool)
        except FetchError as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
            p.stat().st_size > 1024 * 1024 for p in spool.iterdir()):
        time.sleep(0.02)
    assert site.kill_worker()  # nginx's master starts another worker: the range goes there
    thread.join(30)
    assert "error" not in box, box.get("error")
    done = box["done"]
    assert isinstance(done, Download)
    body = site.file("/big/medium.bin").read_bytes()
    assert done.resumed >= 1 and done.status == 206
    assert (done.size, done.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    assert done.path is not None and done.path.read_bytes() == body
    assert wait_for(lambda: ("/slow/medium.bin", 206) in [
        (path, status) for path, status, _sent in site.requests(offset)], 10)


def test_a_redirect_to_a_private_address_is_blocked_by_the_guard_before_connecting(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    error = _error(lambda: downloader.download(site.url("/redirect/blocked.png"),
                                               types=("image/*",), spool_dir=spool))
    assert error.kind == "blocked" and "10.0.0.1" in str(error)
    assert list(spool.iterdir()) == []


def test_a_redirect_is_followed_to_the_asset_unless_follow_refuses_it(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    target = site.url("/images/p0-0.png")
    got = downloader.download(site.url("/redirect/p0.png"), types=("image/*",),
                              spool_dir=spool)
    assert got.final_url == target and got.sha256 == site.assets()[target][0]
    assert got.path is not None
    got.path.unlink()
    held = downloader.download(site.url("/redirect/p0.png"), types=("image/*",),
                               spool_dir=spool, follow=lambda _url: False)
    assert (held.status, held.path, held.headers["location"]) == (301, None, target)
    assert list(spool.iterdir()) == []


def test_a_404_is_returned_without_a_body_or_spool_file(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    got = make_downloader().download(site.url("/images/missing.png"), types=("image/*",),
                                     spool_dir=spool)
    assert (got.status, got.path, got.size) == (404, None, 0)
    assert list(spool.iterdir()) == []


# -- breaks nginx does not make: a few-line server ----------------------------------------------

class BreakingServer:
    """Answers the n-th connection's request with ``answers[n]`` (raw bytes), then keeps the
    connection ``hold_s`` (a stalled read) and closes it: an answer shorter than its
    Content-Length is a transfer cut midway."""

    def __init__(self, answers: list[bytes] | Callable[[int], list[bytes]],
                 hold_s: float = 0.0) -> None:
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answers = answers(self.port) if callable(answers) else answers
        self.hold = threading.Event()
        self.hold_s = hold_s
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for answer in self.answers:
            conn, _peer = self.sock.accept()
            threading.Thread(target=self._answer, args=(conn, answer), daemon=True).start()

    def _answer(self, conn: socket.socket, answer: bytes) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            self.requests.append(request)
            conn.sendall(answer)
            self.hold.wait(self.hold_s)

    def close(self) -> None:
        self.hold.set()
        self.sock.close()
        self.thread.join(5)


BODY = bytes(range(256)) * 400


def _head(status: str, length: int, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/pdf\r\nContent-Length: {length}"
            f"\r\nConnection: close\r\n{extra}\r\n").encode()


def test_a_200_to_a_range_request_starts_the_file_and_its_hash_again(
        spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    ranged = 'Accept-Ranges: bytes\r\nETag: "v1"\r\n'
    server = BreakingServer([_head("200 OK", len(BODY), ranged) + BODY[:5000],
                             _head("200 OK", len(BODY), 'Accept-Ranges: bytes\r\nETag: "v2"\r\n')
                             + BODY])
    try:
        got = make_downloader().download(f"http://localhost:{server.port}/a.pdf",
                                         types=("application/pdf",), spool_dir=spool)
    finally:
        server.close()
    assert b"Range: bytes=5000-" in server.requests[1] and b'If-Range: "v1"' in server.requests[1]
    assert (got.resumed, got.size, got.sha256) == (1, len(BODY), hashlib.sha256(BODY).hexdigest())
    assert got.path is not None and got.path.read_bytes() == BODY


def test_a_break_without_ranges_fails_as_a_transient_connection_error_and_removes_the_file(
        spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    server = BreakingServer([_head("200 OK", len(BODY)) + BODY[:5000]])
    try:
        error = _error(lambda: make_downloader().download(
            f"http://localhost:{server.port}/a.pdf", types=("*",), spool_dir=spool))
    finally:
        server.close()
    assert error.kind == "connection" and error.transient
    assert list(spool.iterdir()) == []


def test_a_redirect_target_loses_its_credentials_before_it_is_requested(
        spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    server = BreakingServer(lambda port: [
        b"HTTP/1.1 302 Found\r\nLocation: http://user:secret@localhost:%d/b.pdf\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n" % port,
        _head("200 OK", len(BODY)) + BODY])
    try:
        got = make_downloader().download(f"http://localhost:{server.port}/a.pdf",
                                         types=("application/pdf",), spool_dir=spool)
    finally:
        server.close()
    assert got.final_url == f"http://localhost:{server.port}/b.pdf" and got.size == len(BODY)
    assert server.requests[1].startswith(b"GET /b.pdf ")
    assert b"authorization" not in server.requests[1].lower()
    assert got.path is not None
    got.path.unlink()


def test_a_stalled_read_is_resumed_from_where_it_stopped(
        spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    validators = 'Accept-Ranges: bytes\r\nLast-Modified: Mon, 02 Nov 2026 10:00:00 GMT\r\n'
    rest = f"Content-Range: bytes 5000-{len(BODY) - 1}/{len(BODY)}\r\n"
    server = BreakingServer([_head("200 OK", len(BODY), validators) + BODY[:5000],
                             _head("206 Partial Content", len(BODY) - 5000, rest)
                             + BODY[5000:]], hold_s=60)
    started = time.monotonic()
    try:
        got = make_downloader(read_timeout_s=1.0).download(
            f"http://localhost:{server.port}/a.pdf", types=("application/pdf",),
            spool_dir=spool)
    finally:
        server.close()
    # libcurl's speed is an average over its last ~5 s: the 1 s stall check fires some
    # seconds in; long before the server's hold ends.
    assert time.monotonic() - started < 20
    assert b"If-Range: Mon, 02 Nov 2026 10:00:00 GMT" in server.requests[1]
    assert (got.status, got.resumed, got.sha256) == (206, 1, hashlib.sha256(BODY).hexdigest())
    assert got.path is not None
    got.path.unlink()


def test_downloads_in_one_fetch_loop_run_side_by_side(
        site: MediaSite, spool: Path, make_downloader: Callable[..., Downloader]) -> None:
    downloader = make_downloader()
    loop = FetchLoop()
    finished: list[str] = []

    def fetch(path: str) -> None:
        got = downloader.download(site.url(path), types=("*",), spool_dir=spool)
        served = site.file(path.replace("/slow/", "/big/"))
        if got.sha256 == hashlib.sha256(served.read_bytes()).hexdigest():
            finished.append(path)

    try:
        loop.spawn(fetch, "/slow/medium.bin")  # about 2 s at the slow location's rate
        loop.spawn(fetch, "/manuals/p0.pdf")
        deadline = time.monotonic() + 30
        while loop.tasks and time.monotonic() < deadline:
            loop.run_once(0.1, lambda: False)
    finally:
        loop.close()
    assert finished == ["/manuals/p0.pdf", "/slow/medium.bin"]
