"""What a render hands the fleet (common/web/renderer.py): the main document's headers, the
page's proxy (redacted), and one log line of what the guard refused. Loopback only: 127.0.0.1
allowed, 127.0.0.2 refused (its log must stay empty)."""

from __future__ import annotations

import logging

import pytest

from common.core.config import Settings, load_settings
from common.web.identity import Identity
from common.web.renderer import Renderer
from devtools.proxies import TinyProxy
from devtools.testsite import TestSite
from tests.helpers import require_tool


@pytest.fixture(scope="module", autouse=True)
def _no_name_leaves_the_machine(loopback_names_only: None) -> None:
    """The browser's guard resolves loopback names only (tests/web/conftest.py)."""


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings({"BROWSER_EXECUTABLE": require_tool("chromium"),
                          "FETCH_ALLOW_NETWORKS": "127.0.0.1/32", "RENDER_TIMEOUT_S": "10"})


def test_a_render_through_a_proxy_has_the_documents_headers_the_proxy_redacted_and_one_refusal_line(
        settings: Settings, sites: tuple[TestSite, TestSite],
        caplog: pytest.LogCaptureFixture) -> None:
    site, other = sites
    long_url = other.url("/secret?q=" + "x" * 400)
    site.route("/mixed", lambda r: (200, {"Content-Type": "text/html; charset=iso-8859-1",
                                          "X-Served-By": "test site"},
                                    (f"<p id=out></p><script>fetch('{long_url}').catch(e => 0)"
                                     f".then(() => fetch('{other.url('/second')}')).catch(e => 0)"
                                     ".finally(() => document.getElementById('out')"
                                     ".textContent = 'done')</script>").encode()))
    caplog.set_level(logging.INFO, logger="common.web.renderer")
    with TinyProxy(auth=("bob", "pw")) as proxy, Renderer(settings) as renderer:
        result = renderer.render(site.url("/mixed"), wait_for="#out:not(:empty)",
                                 identity=Identity(proxy=proxy.url))
        asked = proxy.requests()
    assert result.rendered and result.status == 200
    assert result.content_type == "text/html; charset=utf-8"  # the DOM, serialised
    assert result.headers["content-type"] == "text/html; charset=iso-8859-1"  # as served
    assert result.headers["x-served-by"] == "test site"
    assert result.proxy == f"http://bob:***@127.0.0.1:{proxy.port}"
    assert ("CONNECT", f"127.0.0.1:{site.port}") in asked
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()
             and r.name == "common.web.renderer"]
    assert len(lines) == 1
    assert "2 request(s) refused" in lines[0]
    assert long_url[:200] in lines[0] and long_url[:201] not in lines[0]
    assert other.url("/second") in lines[0] and "FETCH_ALLOW_NETWORKS" in lines[0]
    assert other.log == []
