"""Fetchers for the tests of common/web: allowed onto 127.0.0.0/8 (the loopback sites), closed
after the test. ``make_fetcher`` runs each test twice, fetching in the test's thread (tools,
producers) and in a fetch loop's task (workers, multi.py); ``make_thread_fetcher`` only the
first. ``loopback_names_only``: for the browser's tests, no name is looked up off the machine."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator

import pytest

from common.core.config import Settings
from common.web import browser_guard
from common.web.fetch import Fetcher, FetchResult
from common.web.multi import FetchLoop
from devtools.testsite import TestSite
from tests.helpers import in_fetch_loop

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


class LoopFetcher(Fetcher):
    """A Fetcher whose every fetch runs as a task of a fetch loop, as in a worker."""

    def __init__(self, settings: Settings, loop: FetchLoop) -> None:
        super().__init__(settings)
        self.loop = loop

    def fetch(self, url: str, **kwargs: object) -> FetchResult:  # type: ignore[override]
        return in_fetch_loop(self.loop, super().fetch, url, **kwargs)


def _fetchers(loop: FetchLoop | None) -> Iterator[Callable[..., Fetcher]]:
    made: list[Fetcher] = []

    def make(**overrides: object) -> Fetcher:
        settings = Settings().with_overrides(**{"fetch_allow_networks": LOOPBACK,
                                                **overrides})
        fetcher = Fetcher(settings) if loop is None else LoopFetcher(settings, loop)
        made.append(fetcher)
        return fetcher

    yield make
    for fetcher in made:
        fetcher.close()
    if loop is not None:
        loop.close()


@pytest.fixture(params=["thread", "loop"])
def make_fetcher(request) -> Iterator[Callable[..., Fetcher]]:
    """``make_fetcher(**overrides)``: a Fetcher with these settings over the loopback ones."""
    yield from _fetchers(FetchLoop() if request.param == "loop" else None)


@pytest.fixture
def make_thread_fetcher() -> Iterator[Callable[..., Fetcher]]:
    """As ``make_fetcher``, fetching in the test's thread only."""
    yield from _fetchers(None)


def _loopback_resolve(host: str) -> tuple[str, ...]:
    """``localhost`` and address literals only: any other name is not looked up (no DNS)."""
    if host.lower() == "localhost":
        return ("127.0.0.1",)
    try:
        return (str(ipaddress.ip_address(host.strip("[]"))),)
    except ValueError:  # a name: only loopback literals resolve in the browser's tests
        return ()


@pytest.fixture(scope="module")
def loopback_names_only() -> Iterator[None]:
    """The browser's guard resolves only ``localhost`` and address literals: a name Chromium
    asks for on its own (its services) is refused without a DNS query leaving the machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(browser_guard, "resolve", _loopback_resolve)
        yield


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[TestSite, TestSite]]:
    """The browser tests' two loopback sites: one the guard allows (127.0.0.1), one it
    refuses (127.0.0.2, outside their FETCH_ALLOW_NETWORKS), whose log must stay empty."""
    allowed, refused = TestSite("127.0.0.1").start(), TestSite("127.0.0.2").start()
    yield allowed, refused
    allowed.stop()
    refused.stop()


@pytest.fixture
def site(sites: tuple[TestSite, TestSite]) -> TestSite:
    """The allowed site, its log cleared (and the refused one's)."""
    sites[0].clear_log()
    sites[1].clear_log()
    return sites[0]


@pytest.fixture
def other(sites: tuple[TestSite, TestSite]) -> TestSite:
    """The refused site."""
    return sites[1]
