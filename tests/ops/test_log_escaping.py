"""Log lines cannot be forged: text from outside (URLs, <loc>s, titles, header values, error
strings) carrying a line break reaches the log escaped, in one line (common/ops/cli.py).

Every check splits the output with ``str.splitlines`` (which also breaks at \\r, \\x0b, \\x0c,
\\x1c-\\x1e, \\x85 and U+2028/2029, as many log readers do) and asserts that no line starts with
the forged prefix and that each forged text sits inside a real record line, escaped.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from common.core.config import load_settings
from common.ops.cli import JsonFormatter, TextFormatter, escape_controls
from devtools.testsite import TestSite
from tests.helpers import TEST_ENV, publish_raw
from tests.intake.sitemap_bodies import NS

FORGED = "2026-01-01 INFO [worker-1] forged"
#: The start of a real record line of the text format.
RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[")


def assert_not_forged(output: str, *escaped: str) -> None:
    """No line of ``output`` starts with the forged prefix; every line naming a forgery is a
    real record (or a traceback's exception line); each of ``escaped`` appears as it is."""
    lines = output.splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:15])], output
    for line in lines:
        if "forged" in line:
            assert RECORD.match(line) or re.match(r"\w+(\.\w+)*: ", line), (line, output)
    for text in escaped:
        assert text in output, (text, output)


# -- the formatters -------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through the text formatter setup_logging installs, into a buffer."""
    settings = load_settings({"WORKER_ID": "w-1", "LOG_FORMAT": "text"})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter(settings.worker_id, settings.secrets()))
    log = logging.getLogger("fleet.test.escaping")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield log, stream
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
        log.propagate = True


@pytest.mark.parametrize("char, escape", [
    ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\x00", "\\x00"), ("\x0b", "\\x0b"),
    ("\x1b", "\\x1b"), ("\x7f", "\\x7f"), ("\x85", "\\x85"), ("\x9b", "\\x9b"),
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
])
def test_every_control_character_becomes_an_escape(char, escape):
    assert escape_controls(f"a{char}b") == f"a{escape}b"
    assert escape_controls("Café — 日本語 \\n") == "Café — 日本語 \\n"  # the rest as it is


def test_text_format_escapes_the_message_and_its_arguments(captured):
    log, stream = captured
    log.info("fetched %s title=%r ua=%s", f"http://x/a\n{FORGED}-url",
             f"T\r\n{FORGED}-title", f"curl\u2028{FORGED}-header")
    log.warning(f"literal message\x85{FORGED}-msg")
    assert_not_forged(stream.getvalue(), f"http://x/a\\n{FORGED}-url",
                      f"\\u2028{FORGED}-header", f"\\x85{FORGED}-msg")
    assert len(stream.getvalue().splitlines()) == 2


def test_a_traceback_keeps_its_lines_but_not_the_line_breaks_of_its_messages(captured):
    log, stream = captured
    try:
        try:
            raise ValueError(f"bad <loc>\n{FORGED}-cause")
        except ValueError as exc:
            raise RuntimeError(f"sitemap failed\r\n{FORGED}-outer") from exc
    except RuntimeError:
        log.exception("reading %s", f"http://x/\n{FORGED}-arg")
    output = stream.getvalue()
    assert_not_forged(output, f"ValueError: bad <loc>\\n{FORGED}-cause",
                      f"RuntimeError: sitemap failed\\r\\n{FORGED}-outer",
                      f"reading http://x/\\n{FORGED}-arg")
    assert "Traceback (most recent call last):" in output.splitlines()
    assert any(line.startswith('  File "') for line in output.splitlines())


def test_a_worker_id_with_percent_signs_does_not_break_formatting():
    formatter = TextFormatter("w%1%(x)s")
    record = logging.LogRecord("n", logging.INFO, __file__, 1, "hi %s", ("there",), None)
    assert formatter.format(record).endswith("INFO [w%1%(x)s] n: hi there")


def test_json_format_is_one_object_a_line_whatever_the_message_holds():
    formatter = JsonFormatter("w-1")
    record = logging.LogRecord("n", logging.INFO, __file__, 1, "%s",
                               (f"a\n{FORGED}\u2028b\u2029c\x85d\re",), None)
    line = formatter.format(record)
    assert line.splitlines() == [line]
    assert json.loads(line)["message"] == f"a\n{FORGED}\u2028b\u2029c\x85d\re"


# -- end to end: a hostile sitemap, a hostile site ------------------------------------------


@pytest.fixture
def hostile_site() -> Iterator[TestSite]:
    with TestSite(pages=3) as site:
        yield site


def _serve_xml(site: TestSite, path: str, body: str) -> None:
    site.route(path, lambda _r: (200, {"Content-Type": "application/xml"}, body.encode()))


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_hostile_sitemap_cannot_forge_a_line_of_the_producers_log(run_cli, hostile_site,
                                                                    log_format):
    site = hostile_site
    _serve_xml(site, "/index.xml", (
        f'<?xml version="1.0"?>\n<sitemapindex xmlns="{NS}">'
        f"<sitemap><loc>{site.url('/child.xml')}&#10;{FORGED}-index</loc></sitemap>"
        f"<sitemap><loc>{site.url('/other.xml')}&#133;{FORGED}-nel</loc></sitemap>"
        f"<sitemap><loc>{site.url('/urls.xml')}</loc></sitemap></sitemapindex>\n"))
    _serve_xml(site, "/urls.xml", (
        f'<?xml version="1.0"?>\n<urlset xmlns="{NS}">'
        f"<url><loc>{site.page_url(1)}</loc></url>"
        f"<url><loc>{site.page_url(2)}&#13;&#10;{FORGED}-urlset</loc></url>"
        f"<url><loc>{site.page_url(3)}&#x2028;{FORGED}-ls</loc></url></urlset>\n"))

    result = run_cli("sitemap_producer.py", site.url("/index.xml"),
                     env={"LOG_FORMAT": log_format})

    assert result.returncode == 1, result.stderr  # the two bad children are errors
    if log_format == "json":
        assert not [line for line in result.stderr.splitlines() if line.startswith("2026-01-01")]
        messages = [json.loads(line)["message"] for line in result.stderr.splitlines()
                    if line.startswith("{")]
        assert any(f"child.xml\n{FORGED}-index" in m for m in messages), result.stderr
        return
    assert_not_forged(result.stderr, f"/child.xml\\n{FORGED}-index",
                      f"/other.xml\\x85{FORGED}-nel")
    assert "forged-urlset" in result.stderr and "forged-ls" in result.stderr  # logged, escaped


def test_a_hostile_site_cannot_forge_a_line_of_the_workers_log(settings, run_cli,
                                                               hostile_site):
    with TestSite("127.0.0.2", pages=3) as other:
        # robots.txt redirects to a Location holding line breaks (latin-1: \x85 is NEL).
        other.route("/robots.txt", lambda _r: (
            302, {"Location": f"ftp://127.0.0.2/x\x85{FORGED}-location\x0b{FORGED}-vt"}, b""))
        site = hostile_site
        site.route("/titled", lambda _r: (200, {"Content-Type": "text/html"}, (
            f"<title>Hello\n{FORGED}-title</title><p>hi</p>").encode()))
        site.route("/hop", lambda _r: (302, {"Location": f"ftp://x/\x1e{FORGED}-hop"}, b""))
        bodies = [json.dumps({"url": url}).encode() for url in (
            f"{site.url('/a')}\n{FORGED}-url", site.url("/titled"), site.url("/hop"),
            other.page_url(1))]
        publish_raw(settings, "url_queue_ttl", bodies)

        result = run_cli("worker.py", "--idle-exit", "2",
                         env={**TEST_ENV, "MAX_RETRIES": "0", "WORKER_ID": "w-hostile"},
                         timeout_s=90)

    assert result.returncode == 0, result.stderr
    assert_not_forged(result.stderr, f"/a\\n{FORGED}-url",
                      f"ftp://127.0.0.2/x\\x85{FORGED}-location\\x0b{FORGED}-vt")
