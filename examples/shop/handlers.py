"""Scrape a paged shop: catalog pages lead to product pages; an item pipeline cleans prices.

* ``catalog`` (the default handler) runs on the seed ``/catalog?page=1`` and every next page:
  it follows each product link with the label ``product`` (and the listing's URL as ``meta``),
  follows the next page (no label: the default handler again) and records the listing.
* ``product`` runs only where a listing's label sent it (no URL pattern): name, SKU, price as
  shown, stock.
* ``normalise_price`` (an item pipeline step) turns "€1,205.58", "28.73 EUR" or "€ 1 205.58"
  into 1205.58 and drops a product without a price (``DropItem``): the page's record keeps
  the reason under ``dropped``.

Run it: examples/shop/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

from scrape_fleet import DropItem, Page, Request, Router

router = Router()


@router.default
def catalog(page: Page) -> Iterator[Request | dict[str, Any]]:
    """A catalog page: its products, its next page, and an item for the listing itself."""
    products = page.css("a.product::attr(href)").getall()
    yield page.follow(products, handler="product", meta={"listing": page.url})
    next_page = page.css("a.next::attr(href)").get()
    if next_page:
        yield page.follow(next_page)
    yield {"kind": "listing", "url": page.url, "products": len(set(products))}


@router.handler("product")
def product(page: Page) -> dict[str, Any]:
    """A product page (reached through the ``product`` label only)."""
    return {
        "kind": "product",
        "url": page.url,
        "sku": page.css(".sku::text").get(),
        "name": page.css("h1.name::text").get(),
        "price": page.css(".price::text").get(),  # None when the page shows no price
        "in_stock": bool(page.css(".stock.in-stock")),
        "listing": page.meta.get("listing"),
    }


_NOT_DIGITS = re.compile(r"[^\d.]")


def parse_euros(text: str) -> float:
    """``"€1,205.58"``, ``"28.73 EUR"``, ``"€ 1 205.58"`` -> 1205.58 (ValueError otherwise)."""
    try:
        return float(Decimal(_NOT_DIGITS.sub("", text)).quantize(Decimal("0.01")))
    except InvalidOperation:
        raise ValueError(f"not a price: {text!r}") from None


@router.item
def normalise_price(item: dict[str, Any], page: Page) -> dict[str, Any]:
    """Products: price as a number in euros, or the item is dropped. Listings pass."""
    if item.get("kind") != "product":
        return item
    if not item.get("price"):
        raise DropItem("no price")
    item["price"] = parse_euros(item["price"])
    item["currency"] = "EUR"
    return item
