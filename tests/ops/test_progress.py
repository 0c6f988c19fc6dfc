from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from common.ops.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(total: int | None = None, **kwargs) -> tuple[Progress, io.StringIO, FakeClock]:
    out, clock = io.StringIO(), FakeClock()
    return Progress(total, "seeding", out, clock=clock, **kwargs), out, clock


def test_off_a_terminal_nothing_is_printed_before_the_first_interval():
    progress, out, clock = plain()
    clock.now += 4.9
    progress.advance(500)
    assert out.getvalue() == ""


def test_off_a_terminal_a_plain_line_with_count_and_rate_comes_every_interval():
    progress, out, clock = plain()
    clock.now += 5
    progress.advance(12000)
    clock.now += 5
    progress.advance(3000)
    assert out.getvalue().splitlines() == ["seeding: 12000 URLs (2400/s)",
                                           "seeding: 15000 URLs (600/s)"]


def test_the_final_line_gives_the_total_elapsed_time_and_average_rate():
    progress, out, clock = plain()
    clock.now += 2
    progress.advance(100)
    clock.now += 2
    progress.close()
    progress.close()  # idempotent
    progress.advance(5)  # ignored once closed
    assert out.getvalue().splitlines() == ["seeding: done, 100 URLs in 4.0s (25/s)"]


def test_a_known_total_shows_count_of_total_and_percent():
    progress, out, clock = plain(total=200, unit="sitemaps")
    clock.now += 5
    progress.advance(50)
    assert out.getvalue() == "seeding: 50/200 sitemaps, 25% (10/s)\n"


def test_leaving_the_block_with_an_error_says_stopped():
    out, clock = io.StringIO(), FakeClock()
    with pytest.raises(RuntimeError), Progress(None, "seeding", out, clock=clock) as progress:
        progress.advance(7)
        clock.now += 1
        raise RuntimeError("boom")
    assert out.getvalue() == "seeding: stopped after 7 URLs in 1.0s (7/s)\n"


def test_track_yields_items_unchanged_and_counts_them():
    progress, out, _clock = plain()
    with progress:
        assert list(progress.track(iter("abc"))) == ["a", "b", "c"]
    assert progress.count == 3
    assert out.getvalue().startswith("seeding: done, 3 URLs")


def test_a_stream_that_is_not_a_tty_never_gets_escape_codes():
    progress, out, clock = plain(total=10)
    for _ in range(10):
        clock.now += 1
        progress.advance()
    progress.close()
    assert "\x1b[" not in out.getvalue()


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_on_a_terminal_a_rich_bar_shows_label_count_and_rate():
    screen, clock = io.StringIO(), FakeClock()
    console = Console(file=screen, force_terminal=True, width=100, color_system=None)
    with Progress(100, "seeding", console=console, clock=clock) as progress:
        for _ in range(40):
            clock.now += 0.5
            progress.advance()
    text = _strip_ansi(screen.getvalue())
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("seeding")
    assert "40/100" in last
    assert "2/s" in last
    assert "seeding: done" not in text  # no plain lines on a terminal


def test_on_a_terminal_an_unknown_total_shows_a_question_mark():
    screen, clock = io.StringIO(), FakeClock()
    console = Console(file=screen, force_terminal=True, width=100, color_system=None)
    with Progress(None, "seeding", console=console, clock=clock) as progress:
        clock.now += 1
        progress.advance(12)
    assert "12/?" in _strip_ansi(screen.getvalue())


def test_a_tty_stream_gets_the_rich_bar_without_an_explicit_console():
    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen, clock = FakeTTY(), FakeClock()
    with Progress(5, "seeding", screen, clock=clock) as progress:
        clock.now += 1
        progress.advance(5)
    text = _strip_ansi(screen.getvalue())
    assert "5/5" in text
    assert "seeding: done" not in text
