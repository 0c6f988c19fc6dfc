"""Unit tests for common.core.values: the rate parser's plain forms, read without `limits`."""

from __future__ import annotations

import sys

import limits
import pytest

from common.core.values import rate

RATES = ["60/minute", "1/second", "0/day", "5/hour", "007/minute", "10/second", "2/minutes",
         "60 per minute", "60/2 minutes", "3 / hour", " 60/minute", "60/minute ", "60/MINUTE",
         "1/month", "1/year", "60/minute;1/second", "/minute", "60/", "60/fortnight", "x",
         "", "-1/minute", "1.5/minute", "60/Minute"]


def _limits_reading(raw: str) -> tuple[int, int] | str:
    try:
        item = limits.parse(raw)
    except ValueError:
        return "ValueError"
    return item.amount, item.get_expiry() * 1000


def _our_reading(raw: str) -> tuple[int, int] | str:
    try:
        return rate(raw)
    except ValueError:
        return "ValueError"


@pytest.mark.parametrize("raw", RATES)
def test_a_rate_reads_as_the_limits_package_reads_it(raw: str) -> None:
    assert _our_reading(raw) == _limits_reading(raw)


def test_a_plain_rate_is_read_without_importing_limits_and_another_form_imports_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "limits", None)  # `import limits` now raises ImportError

    assert rate("60/minute") == (60, 60_000)
    assert rate("2/second") == (2, 1_000)
    with pytest.raises(ImportError):
        rate("2 per 10 seconds")
