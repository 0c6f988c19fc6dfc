"""Who a fetch is to a site and which way it goes: :class:`Identity`, given to
:meth:`common.web.fetch.Fetcher.fetch` (cookies from common/web/cookies.py, a proxy from
common/web/proxies.py, chosen per page by common/work/identities.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class CookieJar(Protocol):
    """The cookies one fetch sends and keeps (common/web/cookies.py): asked before each hop,
    told each hop's Set-Cookie lines after it."""

    def header_for(self, url: str) -> str | None:
        """The Cookie header value for a request to ``url`` (None: no cookie applies)."""

    def receive(self, url: str, set_cookies: list[str]) -> None:
        """Keep what the response of ``url`` set (its Set-Cookie header values)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a fetch is to the site and which way it goes: its cookies (None: none sent or kept)
    and its proxy (a URL, credentials inside: never logged; None: direct)."""

    cookies: CookieJar | None = None
    proxy: str | None = None
