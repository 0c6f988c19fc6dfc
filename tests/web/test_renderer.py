"""Rendering through browser threads (common/web/renderer.py): from a plain thread, and from a
fetch loop's task without stalling the loop's other fetches.

Real Chromium on loopback sites only: 127.0.0.1 (allowed: FETCH_ALLOW_NETWORKS is
127.0.0.1/32) and 127.0.0.2 (refused). As in tests/web/test_browser.py, the browser guard
resolves only ``localhost`` and address literals, so no name Chromium asks for leaves the
machine, not even as a DNS query.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from common.core.config import Settings, load_settings
from common.core.errors import FetchError
from common.web import renderer as renderer_module
from common.web.browser import Browser
from common.web.browser_procs import chromium_pids
from common.web.fetch import Fetcher
from common.web.multi import FetchLoop
from common.web.renderer import Renderer
from devtools.testsite import TestSite
from tests.helpers import in_fetch_loop, require_tool, wait_for

HTML = {"Content-Type": "text/html; charset=utf-8"}


def _page(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, HTML, f"<!doctype html><html><body>{body}</body></html>".encode()


def _late(text: str, delay_ms: int) -> tuple[int, dict[str, str], bytes]:
    """A page whose script adds ``<p class=late>TEXT</p>`` after ``delay_ms``."""
    return _page(f"<div id=out></div><script>setTimeout(() => {{"
                 f" document.getElementById('out').innerHTML = '<p class=late>' + '{text}'"
                 f" + '</p>'; }}, {delay_ms});</script>")


@pytest.fixture(scope="module", autouse=True)
def _no_name_leaves_the_machine(loopback_names_only: None) -> None:
    """The browser's guard resolves loopback names only (tests/web/conftest.py)."""


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings({"BROWSER_EXECUTABLE": require_tool("chromium"),
                          "FETCH_ALLOW_NETWORKS": "127.0.0.1/32", "RENDER_TIMEOUT_S": "10"})


@pytest.fixture(scope="module")
def renderer(settings: Settings) -> Iterator[Renderer]:
    with Renderer(settings, threads=2) as made:
        yield made


def _run_all(loop: FetchLoop) -> None:
    while loop.tasks:
        loop.run_once(0.1, lambda: False)


def test_a_page_built_by_javascript_comes_back_as_a_fetch_result_with_the_rendered_html(
        renderer: Renderer, site: TestSite) -> None:
    site.route("/js", lambda r: _page(
        "<div id=out></div><script>document.getElementById('out').innerHTML ="
        " '<p>' + 'made by ' + 'script</p>';</script>"))
    result = renderer.render(site.url("/js"))
    assert b"<p>made by script</p>" in result.body
    assert (result.url, result.final_url, result.status) == (site.url("/js"),) * 2 + (200,)
    assert result.content_type == "text/html; charset=utf-8"
    assert result.sent_at is not None and result.elapsed_ms > 0


def test_a_render_in_a_loop_task_lets_the_loops_plain_fetches_finish_first(
        renderer: Renderer, site: TestSite) -> None:
    site.route("/late", lambda r: _late("rendered late", 1500))
    fetcher = Fetcher(Settings().with_overrides(
        fetch_allow_networks=(ipaddress.ip_network("127.0.0.0/8"),)))
    finished: list[tuple[str, float]] = []
    loop = FetchLoop()

    def render() -> None:
        result = renderer.render(site.url("/late"), wait_for="p.late")
        assert b"rendered late" in result.body
        finished.append(("render", time.monotonic()))

    def plain() -> None:
        for n in range(1, 6):
            assert fetcher.fetch(site.page_url(n)).status == 200
            finished.append((f"page {n}", time.monotonic()))

    try:
        loop.spawn(render)
        loop.spawn(plain)
        _run_all(loop)
    finally:
        loop.close()
        fetcher.close()
    # One thread: had the render blocked it, the plain fetches would all have come after.
    assert [name for name, _at in finished] == [f"page {n}" for n in range(1, 6)] + ["render"]
    assert finished[-1][1] > finished[-2][1]


def test_two_renders_at_once_on_two_threads_each_get_their_own_page(
        renderer: Renderer, site: TestSite) -> None:
    site.route("/one", lambda r: _late("page one", 300))
    site.route("/two", lambda r: _late("page two", 300))
    got: dict[str, bytes] = {}

    def render(name: str) -> None:
        got[name] = renderer.render(site.url(f"/{name}"), wait_for="p.late").body

    threads = [threading.Thread(target=render, args=(name,)) for name in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert b"page one" in got["one"] and b"page two" not in got["one"]
    assert b"page two" in got["two"] and b"page one" not in got["two"]


def test_a_page_the_guard_refuses_fails_as_blocked_in_a_loop_task(
        renderer: Renderer, sites: tuple[TestSite, TestSite]) -> None:
    refused = sites[1]
    loop = FetchLoop()
    try:
        with pytest.raises(FetchError) as caught:
            in_fetch_loop(loop, renderer.render, refused.url("/page/1"))
    finally:
        loop.close()
    assert caught.value.kind == "blocked"
    assert refused.log == []


def test_closing_a_renderer_leaves_no_chromium_running(settings: Settings,
                                                       site: TestSite) -> None:
    before = chromium_pids()
    made = Renderer(settings, threads=2)
    site.route("/short", lambda r: _page("<p>short</p>"))
    assert b"<p>short</p>" in made.render(site.url("/short")).body
    groups = made.groups
    assert groups and chromium_pids(groups)
    made.close()
    assert wait_for(lambda: not chromium_pids(groups), timeout_s=10)
    assert chromium_pids() <= before
    with pytest.raises(FetchError) as caught:
        made.render(site.url("/short"))
    assert caught.value.kind == "connection"


def test_a_browser_killed_mid_render_fails_that_render_as_retriable_and_the_next_works(
        settings: Settings, site: TestSite) -> None:
    site.route("/late", lambda r: _late("rendered late", 3000))
    site.route("/after", lambda r: _page("<p>after the kill</p>"))
    with Renderer(settings, threads=1) as made:
        made.render(site.url("/after"))  # the browser is up
        groups = made.groups
        failed: list[FetchError] = []

        def kill_soon() -> None:
            time.sleep(0.8)
            for group in groups:
                os.killpg(group, signal.SIGKILL)

        killer = threading.Thread(target=kill_soon)
        killer.start()
        try:
            made.render(site.url("/late"), wait_for="p.late")
        except FetchError as exc:
            failed.append(exc)
        killer.join()
        assert len(failed) == 1 and failed[0].transient, failed
        result = made.render(site.url("/after"))
        assert b"after the kill" in result.body
        assert made.groups.isdisjoint(groups)
    assert not chromium_pids(groups)


def test_a_render_past_its_deadline_is_given_up_as_a_timeout_and_the_thread_goes_on(
        settings: Settings, site: TestSite, monkeypatch: pytest.MonkeyPatch) -> None:
    site.route("/late", lambda r: _late("rendered late", 2500))
    site.route("/after", lambda r: _page("<p>next page</p>"))
    # The caller gives up 1.5 s before the browser's own deadline (RENDER_TIMEOUT_S, 10 s).
    monkeypatch.setattr(renderer_module, "MARGIN_S", -8.5)
    with Renderer(settings, threads=1) as made:
        started = time.monotonic()
        with pytest.raises(FetchError) as caught:
            made.render(site.url("/late"), wait_for="p.late")
        assert caught.value.kind == "timeout" and "no render within" in str(caught.value)
        assert time.monotonic() - started < 2.5
        # The abandoned page still ends in the browser thread, which then takes the next job.
        monkeypatch.undo()
        assert b"next page" in made.render(site.url("/after")).body


class _ThreadKilled(BaseException):
    """What ends a browser thread (as an unexpected BaseException would)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_browser_thread_fails_its_job_and_is_started_again_at_the_next(
        settings: Settings, site: TestSite) -> None:
    site.route("/after", lambda r: _page("<p>after a restart</p>"))
    calls: list[str] = []

    def factory() -> Browser:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise _ThreadKilled
        return Browser.from_settings(settings)

    with Renderer(settings, threads=1, browser_factory=factory) as made:
        first = made._slots[0].thread
        with pytest.raises(FetchError) as caught:
            made.render(site.url("/after"))
        assert caught.value.kind == "connection"
        assert wait_for(lambda: not first.is_alive(), timeout_s=5)
        assert b"after a restart" in made.render(site.url("/after")).body
        assert made._slots[0].thread is not first and len(calls) == 2


def test_a_pool_whose_browsers_keep_failing_to_start_says_unhealthy_until_one_renders(
        settings: Settings, site: TestSite) -> None:
    site.route("/fine", lambda r: _page("<p>fine again</p>"))
    broken = [True]

    def factory() -> Browser:
        if broken[0]:  # as a driver that dies at start (a missing library in the image)
            raise RuntimeError("Browser.launch: driver exited: libatomic.so.1: cannot open")
        return Browser.from_settings(settings)

    with Renderer(settings, threads=1, browser_factory=factory) as made:
        assert made.health()[0]
        for attempt in range(3):
            with pytest.raises(FetchError) as caught:
                made.render(site.url("/fine"))
            assert caught.value.kind == "connection"
            healthy, line = made.health()
            assert healthy == (attempt < 2), line
        assert "3 browsers in a row failed: RuntimeError: Browser.launch: driver exited" in line
        broken[0] = False
        assert b"fine again" in made.render(site.url("/fine")).body
        assert made.health()[0]
