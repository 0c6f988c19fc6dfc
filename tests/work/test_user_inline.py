"""HANDLER_ISOLATION=inline's watchdog: a call past its time is stopped inside its thread, and
a call that returned in time is never hit afterwards."""

from __future__ import annotations

import sys
import textwrap
import time
import uuid

import pytest

from common.work.parse import parse_html
from common.work.user_inline import InlineCode

ROUTER = '''
from scrape_fleet import Router

router = Router()

@router.default
def page(page):
    if page.url.endswith("/loop"):
        while True:
            pass
    return {"h1": page.css("h1::text").get()}
'''


@pytest.fixture
def inline(tmp_path, monkeypatch) -> InlineCode:
    name = f"inline_unit_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(ROUTER))
    monkeypatch.syspath_prepend(str(tmp_path))
    return InlineCode("HANDLERS", f"{name}:router", timeout_s=0.02)


def _run(inline: InlineCode, url: str) -> dict | None:
    body = b"<html><body><h1>Kettle</h1></body></html>"
    head = {"url": url, "status": 200, "headers": {}, "content_type": "text/html",
            "data": None}
    got: list = []
    parse_html(body, url, "text/html",
               on_tree=lambda root, base: got.append(inline.run(head, body, root, base)))
    return got[0]


def test_a_loop_is_stopped_and_the_next_call_runs_normally(inline):
    assert _run(inline, "https://s.test/loop") is None
    assert _run(inline, "https://s.test/ok")["items"] == [{"h1": "Kettle"}]


def test_calls_that_return_in_time_are_never_hit_later(inline):
    inline.timeout_s = 0.5  # no call here comes near it, even on a busy machine
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # let the watchdog thread in as often as possible
    try:
        for _ in range(300):
            assert _run(inline, "https://s.test/ok")["items"] == [{"h1": "Kettle"}]
        time.sleep(0.1)  # a stray CallTimedOut would be raised here, failing the test
    finally:
        sys.setswitchinterval(switch)
