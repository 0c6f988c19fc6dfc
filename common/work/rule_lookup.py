"""The first extraction rule matching a URL, for a step that acts before the page is read.

Cookies and proxies (common/work/identities.py) are chosen before the fetch, and a page is
sent to a browser before it is fetched (common/work/render_route.py), each from the first
EXTRACT_RULES rule matching the URL, as extraction chooses. A :class:`RuleLookup` loads each
settings' rules once, and looks at none of them when no rule has a key it cares about (the
page then costs nothing). Rules that do not load are dead-lettered by Read
(``job_settings_invalid``); here they match nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from common.core.config import Settings
from common.core.errors import ConfigError
from common.work.extract import Extractor
from common.work.rules_file import Rule, load_rules


class RuleLookup:
    """``wanted``: whether a rule says something this lookup's user acts on."""

    def __init__(self, wanted: Callable[[Rule], bool]) -> None:
        self.wanted = wanted
        self._extractors: dict[str, Extractor | None] = {}  # EXTRACT_RULES -> its lookup
        self._lock = threading.Lock()

    def match(self, settings: Settings, url: str) -> Rule | None:
        """The first rule of ``settings``' EXTRACT_RULES matching ``url``, when any rule is
        wanted; else None."""
        raw = settings.extract_rules
        if not raw:
            return None
        extractor = self._extractors.get(raw, False)
        if extractor is False:
            extractor = self._load(raw, settings)
        return extractor.match(url) if extractor is not None else None

    def _load(self, raw: str, settings: Settings) -> Extractor | None:
        try:
            rules = load_rules(raw, warn=lambda _message: None)  # Read warns about them
        except ConfigError:
            rules = ()  # the page is dead-lettered by Read (job_settings_invalid)
        extractor = (Extractor(rules, settings.rules_regex_timeout_s)
                     if any(self.wanted(rule) for rule in rules) else None)
        with self._lock:
            self._extractors[raw] = extractor
        return extractor
