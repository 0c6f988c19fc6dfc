"""How a page is rendered: what to wait for and how far to scroll, from a rule or a message.

A rule's ``render`` (EXTRACT_RULES, common/work/rules_file.py) and a work message's ``render``
field (a handler's ``page.follow(url, render=...)``, or the HTTP worker that sent the page to
the render queue) are read here, the one place that checks them::

    render: true                      # rendered with the defaults
    render: {wait_for: ".listing .item", scroll: 5}
    render: {when_missing: ".product"}   # fetched plainly; rendered when the plain page
                                         # lacks the selector (rules only)

``wait_for``: a CSS selector to wait for after the load (content filled in later);
``scroll``: times the page is scrolled to its end, each waiting for the page to grow
(infinite scroll, capped here at :data:`MAX_SCROLLS`); ``when_missing``: the adaptive check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The most scrolls a page may ask for (an infinite page is capped by its rule).
MAX_SCROLLS = 50
#: Longest selector accepted (a message's value is untrusted).
MAX_SELECTOR_CHARS = 500
KEYS = ("wait_for", "scroll", "when_missing")


class BadRenderOptions(ValueError):
    """A ``render`` value that is not true, false or a mapping of :data:`KEYS`."""


@dataclass(frozen=True, slots=True)
class RenderOptions:
    wait_for: str | None = None
    scroll: int = 0
    when_missing: str | None = None  # rules only: render when the plain page lacks it

    @property
    def adaptive(self) -> bool:
        """The page is fetched plainly first, and rendered only when it lacks a selector."""
        return self.when_missing is not None

    def to_message(self) -> Any:
        """The message's ``render`` field: true, or the options a render worker needs."""
        fields = {k: v for k, v in (("wait_for", self.wait_for), ("scroll", self.scroll)) if v}
        return fields or True


def parse_render(value: Any, *, from_rule: bool = False) -> RenderOptions | None:
    """``value`` as render options; None for false or absent.

    Raises:
        BadRenderOptions: anything else than true, false or a mapping of known keys with
            values of the right kind (``when_missing`` only in a rule).
    """
    if value is None or value is False:
        return None
    if value is True:
        return RenderOptions()
    if not isinstance(value, dict):
        raise BadRenderOptions(f"expected true, false or a mapping, got {type(value).__name__}")
    allowed = KEYS if from_rule else KEYS[:2]
    unknown = [str(k) for k in value if k not in allowed]
    if unknown:
        raise BadRenderOptions(f"unknown key(s) {', '.join(sorted(unknown))[:200]} (known: "
                               f"{', '.join(allowed)})")
    scroll = value.get("scroll", 0)
    if not isinstance(scroll, int) or isinstance(scroll, bool) or not 0 <= scroll <= MAX_SCROLLS:
        raise BadRenderOptions(f"scroll: expected a whole number from 0 to {MAX_SCROLLS}, "
                               f"got {str(scroll)[:40]!r}")
    selectors = {}
    for key in ("wait_for", "when_missing"):
        selector = value.get(key)
        if selector is not None and not (isinstance(selector, str) and selector.strip()
                                         and len(selector) <= MAX_SELECTOR_CHARS):
            raise BadRenderOptions(f"{key}: expected a CSS selector (at most "
                                   f"{MAX_SELECTOR_CHARS} characters)")
        selectors[key] = selector.strip() if selector else None
    return RenderOptions(wait_for=selectors["wait_for"], scroll=scroll,
                         when_missing=selectors["when_missing"])
