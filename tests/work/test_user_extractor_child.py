"""EXTRACTOR's child process (common/work/user_extractor.py) without the fleet: a user module
in tmp_path, pages handed to :meth:`Call.on_tree` by parse_html as the worker's PageReader does.

What the child must guarantee: the function never runs in the worker's process, a call over
HANDLER_TIMEOUT_S is stopped (even one holding the GIL), a child that dies or runs out of its
address space is a ``crashed:`` error, and the next page gets a fresh child."""

from __future__ import annotations

import faulthandler
import os
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from common.web.fetch import FetchResult
from common.work.parse import parse_html
from common.work.user_extractor import UserExtractor

PAGE = b"<html><body><h1>Widget</h1><p class=price>12.50</p></body></html>"

USER_MODULE = '''
import os, re, time

def extract(page):
    if page.url.endswith("/loop"):
        while True:
            pass
    if page.url.endswith("/regex"):
        re.search(r"(\\d+)+$", "1" * 40 + "x")  # catastrophic: holds the GIL for hours
    if page.url.endswith("/allocate"):
        block = bytearray(2 << 30)  # 2 GiB
        return {"data": {"allocated": len(block)}}
    if page.url.endswith("/exit"):
        os._exit(3)
    return {"data": {"pid": os.getpid(), "h1": page.root.findtext(".//h1"),
                     "price": page.selector.css(".price::text").get()},
            "follow": ["next"], "priority": True}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    name = f"ux_child_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.fixture
def extractor(user_module) -> Iterator[UserExtractor]:
    made = UserExtractor(f"{user_module}:extract", 1.0)
    yield made
    made.close()


@pytest.fixture(autouse=True)
def hang_guard() -> Iterator[None]:
    """A call running in this process (the inline design) would hold the GIL for hours: end
    the test run with a traceback instead of hanging it."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _page(extractor: UserExtractor, path: str) -> tuple[dict, list[str], dict[str, int]]:
    """One page through the extractor as PageReader runs it: (record, follow, counters)."""
    url = f"http://shop.test{path}"
    response = FetchResult(url=url, final_url=url, status=200, body=PAGE, elapsed_ms=1.0,
                           content_type="text/html; charset=utf-8",
                           headers={"content-type": "text/html; charset=utf-8"})
    record: dict = {"data": {"rule": "kept"}}
    call = extractor.bind(record, response)
    parse_html(PAGE, url, response.content_type, on_tree=call.on_tree)
    return record, [url for group in call.follow for url in group["urls"]], call.counters


def test_the_function_runs_in_another_process_and_gives_what_it_gave_inline(extractor):
    record, follow, counters = _page(extractor, "/item")
    pid = record["data"].pop("pid")
    assert pid != os.getpid()
    assert record == {"data": {"rule": "kept", "h1": "Widget", "price": "12.50"}}
    assert follow == ["http://shop.test/next"] and counters == {}
    again, _, _ = _page(extractor, "/item")
    assert again["data"]["pid"] == pid  # one long-lived child, not one per page
    # The OOM killer's first choice, so a container's memory limit takes it and not the worker.
    assert open(f"/proc/{pid}/oom_score_adj").read().strip() == "1000"


def test_a_function_that_loops_forever_times_out_and_a_fresh_child_takes_the_next_page(
        extractor):
    first, _, _ = _page(extractor, "/item")
    started = time.monotonic()
    looped, follow, counters = _page(extractor, "/loop")
    took_s = time.monotonic() - started
    assert looped["data_errors"]["extractor"].startswith("timeout: over HANDLER_TIMEOUT_S (1 s)")
    assert looped["data"] == {"rule": "kept"} and follow == []
    assert 1.0 <= took_s < 2.5
    assert counters == {"extractor_timeouts": 1}
    after, _, _ = _page(extractor, "/item")
    assert after["data"]["price"] == "12.50" and "data_errors" not in after
    assert after["data"]["pid"] != first["data"]["pid"]
    assert extractor.counts() == {"timeout": 1, "crash": 0}


def test_a_catastrophic_regex_times_out_while_the_workers_other_threads_run(extractor):
    _page(extractor, "/item")  # the child is up: what follows times the regex alone
    ticks = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        before = ticks[0]
        record, _, counters = _page(extractor, "/regex")
        during = ticks[0] - before
    finally:
        stop.set()
        ticker.join(5)
    assert record["data_errors"]["extractor"].startswith("timeout:")
    assert counters == {"extractor_timeouts": 1}
    assert during >= 40  # ~100 ticks in the 1 s the call had; none if it held our GIL


def test_a_function_allocating_2_gib_crashes_its_child_not_the_worker(extractor):
    crashes = extractor.counts()["crash"]
    record, _, counters = _page(extractor, "/allocate")
    assert record["data_errors"]["extractor"] == (
        "crashed: MemoryError over HANDLER_MAX_MEMORY_BYTES (536870912)")
    assert "allocated" not in record["data"]
    assert counters == {"extractor_crashes": 1}
    assert extractor.counts()["crash"] == crashes + 1
    after, _, _ = _page(extractor, "/item")
    assert after["data"]["price"] == "12.50"


def test_a_smaller_memory_cap_stops_a_smaller_allocation(user_module):
    small = UserExtractor(f"{user_module}:extract", 2.0, max_memory_bytes=256 << 20)
    try:
        ok, _, _ = _page(small, "/item")
        assert ok["data"]["price"] == "12.50"  # a child at rest fits in 256 MiB
        record, _, _ = _page(small, "/allocate")
        assert record["data_errors"]["extractor"].startswith("crashed: MemoryError over "
                                                             "HANDLER_MAX_MEMORY_BYTES (268435456)")
    finally:
        small.close()


def test_a_function_calling_os_exit_is_a_crash_and_the_next_page_is_extracted(extractor):
    record, _, counters = _page(extractor, "/exit")
    assert record["data_errors"]["extractor"] == (
        "crashed: the extractor process exited with code 3")
    assert counters == {"extractor_crashes": 1}
    after, _, _ = _page(extractor, "/item")
    assert after["data"]["h1"] == "Widget"
    assert extractor.counts() == {"timeout": 0, "crash": 1}


def test_a_child_killed_from_outside_is_a_crash(extractor):
    first, _, _ = _page(extractor, "/item")
    child_pid = first["data"]["pid"]
    # Killed between pages (an operator, the OOM killer): the next page starts a new child.
    os.kill(child_pid, 9)
    time.sleep(0.2)
    after, _, counters = _page(extractor, "/item")
    assert after["data"]["pid"] != child_pid and counters == {}


def test_close_ends_every_child(extractor):
    first, _, _ = _page(extractor, "/item")
    pid = first["data"]["pid"]
    extractor.close()
    assert _gone(pid)


def test_a_module_the_child_cannot_import_is_a_crash_not_a_hang(user_module, tmp_path):
    made = UserExtractor(f"{user_module}:extract", 1.0)
    (tmp_path / f"{user_module}.py").write_text("raise ImportError('only in the worker')\n")
    try:
        record, _, counters = _page(made, "/item")
    finally:
        made.close()
    assert record["data_errors"]["extractor"].startswith(
        "crashed: the extractor process could not load it: ConfigError: EXTRACTOR=")
    assert counters == {"extractor_crashes": 1}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
