"""The tool-backed downloaders (common/media/tools.py): yt-dlp and gallery-dl in a limited child
process, against Debian's nginx on loopback (devtools/media_site.py).

Every address is 127.0.0.1, reached by names /etc/hosts knows (``localhost``). The guard tests
allow only 127.0.0.2 (no site there): the guard proxy refuses the site before connecting, and
the site's access log stays empty; a redirect to 10.0.0.1 is refused before any connection.
Each yt-dlp run takes ~1 s (its import), gallery-dl's ~0.5 s.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.media_types import parse_caps
from common.media.tools import Tool, ToolDownloader, yt_dlp_arguments
from common.web.multi import FetchLoop
from devtools.media_site import MediaSite, png
from devtools.nginx_site import NginxSite
from devtools.tls import make_pki
from tests.helpers import in_fetch_loop

# yt-dlp and gallery-dl come with requirements-dev.lock (requirements-media-tools.txt): a
# machine without them fails these tests (tool_missing), it does not skip them.

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
CAPS = "image/*=1MB,video/*=1MB,*=32MB"
CLIP = os.urandom(300_000)
LONG_CLIP = os.urandom(2_000_000)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MediaSite]:
    with MediaSite(tmp_path_factory.mktemp("tools"), products=4, large_bytes=1 << 20,
                   slow_rate="64k") as served:
        (served.root / "video").mkdir()
        (served.root / "video" / "clip.mp4").write_bytes(CLIP)
        (served.root / "video" / "long.mp4").write_bytes(LONG_CLIP)
        yield served


@pytest.fixture
def make_tools() -> Iterator[Callable[..., ToolDownloader]]:
    made: list[ToolDownloader] = []

    def make(tools: dict[str, Tool] | None = None, **overrides: object) -> ToolDownloader:
        settings = Settings().with_overrides(**{"fetch_allow_networks": LOOPBACK,
                                                "media_max_bytes": parse_caps(CAPS),
                                                "media_timeout_s": 30.0, **overrides})
        made.append(ToolDownloader(settings, tools=tools))
        return made[-1]

    yield make
    for tools in made:
        tools.close()


def _error(call: Callable[[], object]) -> FetchError:
    with pytest.raises(FetchError) as info:
        call()
    return info.value


def _processes_naming(text: str) -> dict[int, int]:
    """{pid: process group} of every process whose command line names ``text``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found[int(entry.name)] = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
    return found


@pytest.mark.parametrize(("tool", "where"), [("yt-dlp", "thread"), ("yt-dlp", "fetch loop"),
                                             ("gallery-dl", "thread")])
def test_a_tool_downloads_a_direct_video_file_into_a_spool_file_with_its_hash(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader],
        tool: str, where: str) -> None:
    tools = make_tools()
    url = site.url("/video/clip.mp4")
    loop = FetchLoop() if where == "fetch loop" else None
    try:
        got = (tools.download(url, tool=tool, types=("video/*",), spool_dir=spool)
               if loop is None else in_fetch_loop(loop, tools.download, url, tool=tool,
                                                  types=("video/*",), spool_dir=spool))
    finally:
        if loop is not None:
            loop.close()
    assert (got.status, got.media_type, got.size) == (200, "video/mp4", len(CLIP))
    assert got.sha256 == hashlib.sha256(CLIP).hexdigest()
    assert got.path is not None and got.path.read_bytes() == CLIP
    assert got.path.name.startswith("asset-")
    assert list(spool.iterdir()) == [got.path]  # the tool's directory is gone
    assert (got.url, got.final_url, got.resumed, got.headers) == (url, url, 0, {})
    assert got.sent_at is not None and got.elapsed_ms > 0


def test_a_tool_that_is_not_installed_or_not_known_is_tool_missing(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader]) -> None:
    tools = make_tools(tools={"absent": Tool("no_such_module_of_the_tests", yt_dlp_arguments)})
    for name in ("absent", "yt-dlp"):  # yt-dlp is installed, but not one of these tools
        error = _error(lambda name=name: tools.download(site.url("/video/clip.mp4"), tool=name,
                                                        types=("video/*",), spool_dir=spool))
        assert error.kind == "tool_missing" and not error.transient
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize(("tool", "path", "caps", "how"), [
    ("yt-dlp", "/big/huge.mp4", CAPS, "Content-Length 2 GiB over every cap: no body read"),
    ("gallery-dl", "/big/huge.mp4", CAPS, "Content-Length 2 GiB over every cap: no body read"),
    ("yt-dlp", "/video/long.mp4", CAPS, "2 MB downloaded, over the 1 MB cap of video/*"),
    ("yt-dlp", "/stream/medium.bin", "*=4MB", "8 MiB, no Content-Length: a write fails at 4 MB"),
])
def test_a_file_over_its_cap_is_too_large_and_leaves_nothing_in_the_spool_dir(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader],
        tool: str, path: str, caps: str, how: str) -> None:
    tools = make_tools(media_max_bytes=parse_caps(caps))
    error = _error(lambda: tools.download(site.url(path), tool=tool, types=("*",),
                                          spool_dir=spool))
    assert error.kind == "too_large", (how, str(error))
    assert list(spool.iterdir()) == []


def test_a_file_of_a_type_not_asked_for_is_type_refused_and_removed(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader]) -> None:
    tools = make_tools()
    error = _error(lambda: tools.download(site.url("/images/p0-0.png"), tool="yt-dlp",
                                          types=("video/*", "audio/*"), spool_dir=spool))
    assert error.kind == "type_refused" and "image/png" in str(error)
    assert list(spool.iterdir()) == []


def test_a_failing_tool_says_its_last_lines_without_the_urls_password(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader]) -> None:
    tools = make_tools()
    url = site.url("/video/missing.mp4").replace("://", "://user:s3cretpw@", 1)
    error = _error(lambda: tools.download(url, tool="yt-dlp", types=("video/*",),
                                          spool_dir=spool))
    assert error.kind == "tool_failed" and not error.transient
    assert "404" in str(error) and "exited with 1" in str(error)
    assert "s3cretpw" not in str(error)
    assert list(spool.iterdir()) == []


def test_a_hung_tool_is_killed_at_the_timeout_with_its_whole_process_group(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader]) -> None:
    tools = make_tools(media_timeout_s=2.0)
    seen: dict[int, int] = {}
    done = threading.Event()

    def watch() -> None:  # the tool's processes, while it runs (its -o names the spool dir)
        while not done.is_set():
            seen.update(_processes_naming(str(spool)))
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # 8 MiB at 64 kB/s: two minutes
        error = _error(lambda: tools.download(site.url("/slow/medium.bin"), tool="yt-dlp",
                                              types=("*",), spool_dir=spool))
    finally:
        done.set()
        watcher.join()
    assert error.kind == "timeout" and error.transient and "MEDIA_TIMEOUT_S" in str(error)
    assert error.sent_at is not None
    assert seen, "the tool's process was never seen"
    for group in set(seen.values()):
        assert group != os.getpgrp()  # a session of its own
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)  # nothing of it is left
    assert _processes_naming(str(spool)) == {}
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("tool", ["yt-dlp", "gallery-dl"])
def test_the_guard_proxy_refuses_an_address_the_guard_refuses_before_connecting(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader],
        tool: str) -> None:
    # 127.0.0.2 only: localhost (127.0.0.1 in /etc/hosts) is refused
    tools = make_tools(fetch_allow_networks=(ipaddress.ip_network("127.0.0.2/32"),))
    since = site.log_offset()
    port = site.url("/").rsplit(":", 1)[1].split("/", 1)[0]
    for host in ("localhost", "127.0.0.1"):
        error = _error(lambda host=host: tools.download(
            site.url("/video/clip.mp4", host=host), tool=tool, types=("video/*",),
            spool_dir=spool))
        assert error.kind == "blocked", str(error)
        assert f"{host}:{port}" in tools.proxy.refused
    assert site.requests(since) == []  # nothing reached the site
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("tool", ["yt-dlp", "gallery-dl"])
def test_a_redirect_hop_to_a_private_address_is_refused_by_the_guard_proxy(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader],
        tool: str) -> None:
    tools = make_tools()  # loopback allowed: the first hop is fetched, the second refused
    error = _error(lambda: tools.download(site.url("/redirect/blocked.png"), tool=tool,
                                          types=("image/*",), spool_dir=spool))
    assert error.kind == "blocked", str(error)
    assert set(tools.proxy.refused) == {"10.0.0.1:80"}  # gallery-dl tries twice (--retries 1)
    assert list(spool.iterdir()) == []


def test_a_tool_past_its_memory_limit_fails_with_a_memory_error(
        site: MediaSite, spool: Path, make_tools: Callable[..., ToolDownloader]) -> None:
    # python -m timeit runs its statement: 2 GiB, past the child's 1 GiB address space
    greedy = Tool("timeit", lambda run: ["-n", "1", "-r", "1", "bytearray(2 * 1024 ** 3)"])
    tools = make_tools(tools={"greedy": greedy})
    error = _error(lambda: tools.download(site.url("/video/clip.mp4"), tool="greedy",
                                          types=("*",), spool_dir=spool))
    assert error.kind == "tool_failed" and "MemoryError" in str(error), str(error)
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("tool", ["yt-dlp", "gallery-dl"])
def test_https_trusts_fetch_ca_bundle_and_nothing_else(
        tmp_path: Path, spool: Path, make_tools: Callable[..., ToolDownloader],
        tool: str) -> None:
    pki = make_pki(tmp_path / "pki")
    root = tmp_path / "docroot"
    root.mkdir()
    image = png(12, 12, 7)
    (root / "a.png").write_bytes(image)
    with NginxSite(root, tls=pki.leaf, server_extra="        types { image/png png; }\n") as tls:
        url = tls.url("/a.png")
        got = make_tools(fetch_ca_bundle=str(pki.ca_cert)).download(
            url, tool=tool, types=("image/*",), spool_dir=spool)
        assert got.path is not None and got.path.read_bytes() == image
        got.path.unlink()
        error = _error(lambda: make_tools().download(url, tool=tool, types=("image/*",),
                                                     spool_dir=spool))
    assert error.kind == "tool_failed" and "certificate" in str(error).lower(), str(error)
    assert list(spool.iterdir()) == []
