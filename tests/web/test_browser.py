"""Rendering in the distribution's Chromium (common/web/browser.py) and the browser's address
guard (common/web/browser_guard.py).

One browser for the module, on two loopback sites: 127.0.0.1 (allowed: FETCH_ALLOW_NETWORKS
is 127.0.0.1/32) and 127.0.0.2 (refused), whose request log must stay empty. Addresses off
loopback are tested only through the guard function, never in a page the browser loads. No
name leaves the machine either: here the guard resolves only ``localhost`` and address
literals (``loopback_names_only``), so a name Chromium asks for on its own (its services) is
refused without a DNS query.
"""

from __future__ import annotations

import re
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator

import pytest

from common.core.config import load_settings
from common.core.errors import FetchError
from common.web.browser import Browser
from common.web.browser_guard import GuardProxy, refusal
from common.web.browser_procs import chromium_pids
from common.web.netguard import guard_from_setting
from devtools.testsite import TestSite
from tests.helpers import require_tool

GUARD = guard_from_setting("127.0.0.1/32")
HTML = {"Content-Type": "text/html; charset=utf-8"}


def _page(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, HTML, f"<!doctype html><html><body>{body}</body></html>".encode()


@pytest.fixture(scope="module", autouse=True)
def _no_name_leaves_the_machine(loopback_names_only: None) -> None:
    """The browser's guard resolves loopback names only (tests/web/conftest.py)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    settings = load_settings({"BROWSER_EXECUTABLE": require_tool("chromium"),
                              "FETCH_ALLOW_NETWORKS": "127.0.0.1/32", "RENDER_TIMEOUT_S": "10"})
    with Browser.from_settings(settings) as made:
        yield made


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_content_injected_by_javascript_is_in_the_rendered_html_only(
        browser: Browser, site: TestSite) -> None:
    site.route("/js", lambda r: _page(
        "<div id=out></div><script>document.getElementById('out').innerHTML ="
        " '<p class=made>' + 'made by ' + 'script</p>';</script>"))
    plain = urllib.request.urlopen(site.url("/js"), timeout=5).read().decode()
    result = browser.render(site.url("/js"))
    assert "made by script" in result.html
    assert "made by script" not in plain
    assert result.status == 200
    assert result.requests[0] == (site.url("/js"), "document", "allowed")


def test_a_listing_loaded_by_xhr_is_rendered_when_its_selector_is_waited_for(
        browser: Browser, site: TestSite) -> None:
    site.route("/items.json", lambda r: (200, {"Content-Type": "application/json"},
                                         b'["alpha", "beta", "gamma"]'))
    site.route("/listing", lambda r: _page(
        "<ul id=list></ul><script>setTimeout(() => { var x = new XMLHttpRequest();"
        " x.onload = () => JSON.parse(x.responseText).forEach(t => {"
        " var li = document.createElement('li'); li.className = 'item'; li.textContent = t;"
        " document.getElementById('list').appendChild(li); });"
        " x.open('GET', '/items.json'); x.send(); }, 300);</script>"))
    result = browser.render(site.url("/listing"), wait_for="li.item")
    assert result.html.count('class="item"') == 3
    assert (site.url("/items.json"), "xhr", "allowed") in result.requests


def test_a_redirect_made_by_script_ends_on_its_target(browser: Browser, site: TestSite) -> None:
    site.route("/go", lambda r: _page(
        "<script>location.replace('/page/3')</script>"))
    result = browser.render(site.url("/go"), wait_for="a")
    assert result.final_url == site.page_url(3)
    title = re.search(r"<title>[^<]+</title>", site.page_html(3))
    assert title is not None and title.group() in result.html


def test_http_redirects_on_an_allowed_site_are_followed_through_the_guard_proxy(
        browser: Browser, site: TestSite) -> None:
    result = browser.render(site.url("/redirect/2"))
    assert (result.final_url, result.status) == (site.page_url(1), 200)
    assert site.count("/redirect/1") == 1


def test_requests_to_a_refused_address_never_reach_it(
        browser: Browser, site: TestSite, other: TestSite) -> None:
    site.route("/leaky", lambda r: _page(
        f"<link rel=preconnect href='{other.base_url}'>"
        f"<img src='{other.url('/pixel.png')}'><iframe src='{other.url('/frame')}'></iframe>"
        f"<div id=out></div><script>var x = new XMLHttpRequest();"
        f" x.onloadend = () => document.getElementById('out').textContent = 'xhr ' + x.status;"
        f" x.open('GET', '{other.url('/secret')}'); x.send();"
        f" fetch('{other.url('/fetched')}').catch(() => 0);</script>"))
    site.route("/hop", lambda r: (302, {"Location": other.url("/landing")}, b""))
    saved = browser.block_types
    browser.block_types = frozenset()  # the image goes to the address guard, not the type
    try:
        result = browser.render(site.url("/leaky"), wait_for="#out:not(:empty)")
        with pytest.raises(FetchError) as hop:
            browser.render(site.url("/hop"))
    finally:
        browser.block_types = saved
    verdicts = {url: verdict for url, _, verdict in result.requests}
    for path in ("/pixel.png", "/frame", "/secret", "/fetched"):
        assert verdicts[other.url(path)].startswith("refused: connection to 127.0.0.2")
    assert "xhr 0" in result.html
    assert hop.value.kind == "blocked"  # the second hop, refused by the guard proxy
    assert f"127.0.0.2:{other.port}" in str(hop.value)
    assert other.log == []


def test_a_download_is_no_page_and_an_unreachable_site_a_connection_failure(
        browser: Browser, site: TestSite) -> None:
    with pytest.raises(FetchError) as download:
        browser.render(site.url("/binary"))
    assert download.value.kind == "invalid"
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    with pytest.raises(FetchError) as refused:
        browser.render(f"http://127.0.0.1:{closed_port}/")
    assert refused.value.kind == "connection"


def test_images_are_blocked_by_type_by_default(browser: Browser, site: TestSite) -> None:
    site.route("/pictured", lambda r: _page("<img src='/pixel.png'><p>text</p>"))
    result = browser.render(site.url("/pictured"))
    assert (site.url("/pixel.png"), "image",
            "refused: resource type image blocked (RENDER_BLOCK_TYPES)") in result.requests
    assert site.count("/pixel.png") == 0


def test_a_websocket_to_a_refused_address_is_closed_before_it_connects(
        browser: Browser, site: TestSite, other: TestSite) -> None:
    ws_url = f"ws://{other.netloc}/socket"
    site.route("/ws", lambda r: _page(
        f"<div id=out></div><script>var ws = new WebSocket('{ws_url}');"
        " ws.onclose = e => document.getElementById('out').textContent = 'closed ' + e.code;"
        "</script>"))
    result = browser.render(site.url("/ws"), wait_for="#out:not(:empty)")
    assert (ws_url, "websocket",
            "refused: connection to 127.0.0.2 refused by the address guard "
            "(FETCH_ALLOW_NETWORKS)") in result.requests
    assert "closed 1008" in result.html
    assert other.log == []


def test_a_page_slower_than_the_render_timeout_fails_as_a_timeout(
        browser: Browser, site: TestSite) -> None:
    saved, browser.timeout_s = browser.timeout_s, 1.0
    started = time.monotonic()
    try:
        with pytest.raises(FetchError) as failed:
            browser.render(site.url("/slow/5"))
    finally:
        browser.timeout_s = saved
    assert failed.value.kind == "timeout"
    assert time.monotonic() - started < 4
    assert browser.render(site.page_url(1)).status == 200  # the browser goes on


def test_a_script_that_never_ends_is_stopped_at_the_render_timeout(
        browser: Browser, site: TestSite) -> None:
    site.route("/spin", lambda r: _page(
        "<p id=early>x</p><script>setTimeout(() => { while (true) {} }, 50)</script>"))
    saved, browser.timeout_s = browser.timeout_s, 1.0
    started = time.monotonic()
    try:
        with pytest.raises(FetchError) as failed:
            browser.render(site.url("/spin"), wait_for="#never")
    finally:
        browser.timeout_s = saved
    assert failed.value.kind == "timeout"
    assert time.monotonic() - started < 4
    assert browser.render(site.page_url(1)).status == 200


def test_a_dom_over_the_cap_is_refused_as_invalid(browser: Browser, site: TestSite) -> None:
    site.route("/huge", lambda r: _page(
        "<script>for (let i = 0; i < 500; i++)"
        " document.body.appendChild(document.createElement('span'));</script>"))
    saved, browser.max_dom_nodes = browser.max_dom_nodes, 400
    try:
        with pytest.raises(FetchError) as failed:
            browser.render(site.url("/huge"))
    finally:
        browser.max_dom_nodes = saved
    assert failed.value.kind == "invalid"
    assert "DOM nodes" in str(failed.value)


def test_the_browser_is_replaced_after_its_pages_and_closing_leaves_no_chromium(
        site: TestSite) -> None:
    made = Browser(require_tool("chromium"), GUARD, pages_per_browser=2)
    try:
        made.render(site.page_url(1))
        first = chromium_pids(made.groups)
        assert len(first) > 2  # the browser, its zygotes, renderers, GPU and network services
        assert made.memory_bytes() > 10_000_000
        made.render(site.page_url(2))
        made.render(site.page_url(3))
        second = chromium_pids(made.groups)
        assert made.launches == 2
        assert second and not first & second
        assert not any(_alive(pid) for pid in first)
        groups = made.groups
    finally:
        made.close()
    assert not any(_alive(pid) for pid in second)
    assert chromium_pids(groups) == set()


# -- the guard function and the guard proxy, without a browser ----------------------------


@pytest.mark.parametrize("url", [
    "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/", "https://192.168.1.1/",
    "http://[fe80::1]/", "ws://127.0.0.2:81/socket", "http://[::ffff:10.1.2.3]/"])
def test_private_link_local_and_other_loopback_addresses_are_refused(url: str) -> None:
    assert refusal(url, "xhr", GUARD).startswith("connection to ")


@pytest.mark.parametrize(("url", "resource_type", "expected"), [
    ("file:///etc/passwd", "document", "scheme file not allowed"),
    ("javascript:alert(1)", "document", "scheme javascript not allowed"),
    ("ftp://127.0.0.1/", "other", "scheme ftp not allowed"),
    ("http://no-such-host.invalid/", "xhr", "no-such-host.invalid does not resolve"),
    ("http://127.0.0.1/a.woff2", "font", "resource type font blocked (RENDER_BLOCK_TYPES)")])
def test_other_schemes_unresolvable_hosts_and_blocked_types_are_refused(
        url: str, resource_type: str, expected: str) -> None:
    assert refusal(url, resource_type, GUARD, frozenset({"font"})) == expected


def test_local_data_and_allowed_addresses_pass() -> None:
    for url in ("data:text/plain,x", "blob:http://127.0.0.1/uuid", "about:blank",
                "http://127.0.0.1:8080/x", "wss://127.0.0.1/ws"):
        assert refusal(url, "fetch", GUARD) is None


def _socks_connect(proxy: GuardProxy, host: str, port: int) -> int:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        name = host.encode()
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
        return sock.recv(10)[1]


def test_the_guard_proxy_connects_only_to_allowed_addresses(
        sites: tuple[TestSite, TestSite]) -> None:
    allowed, refused = sites
    refused.clear_log()
    proxy = GuardProxy(GUARD)
    try:
        assert _socks_connect(proxy, "127.0.0.1", allowed.port) == 0
        assert _socks_connect(proxy, "127.0.0.2", refused.port) == 2  # not allowed
        assert _socks_connect(proxy, "update.googleapis.com", 443) == 2  # Chromium's own
    finally:
        proxy.close()
    assert proxy.refused == [f"127.0.0.2:{refused.port}", "update.googleapis.com:443"]
    assert refused.log == []

