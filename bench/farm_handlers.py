"""The extract phase's handler variant: the same five fields and list of items as FARM_RULES
(bench/extract_rounds.py) and the peers' spider (bench/peer_fields.py's ``farm_data``), written
as a user writes a handler (``HANDLERS=bench.farm_handlers:router``). One item per page."""

from __future__ import annotations

from urllib.parse import urljoin

from bench.peer_fields import farm_data
from scrape_fleet import Page, Router

router = Router()


@router.default
def farm_page(page: Page) -> dict:
    """The peers' own extraction code, on the page's parsel selector: the fleet's handler and
    the peers' spiders read the very same fields the very same way."""
    return farm_data(page.selector, lambda href: urljoin(page.url, href))
