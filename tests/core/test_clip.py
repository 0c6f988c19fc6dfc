from __future__ import annotations

from common.core.redact import LOG_VALUE_MAX_CHARS, clip


def test_text_up_to_the_cap_is_shown_whole():
    text = "h" * LOG_VALUE_MAX_CHARS
    assert clip(text) is text


def test_longer_text_keeps_its_start_and_says_how_much_was_cut():
    assert clip("abcdefgh", 3) == "abc…[+5 chars]"
