"""The router: your handlers by name, which one reads a page, and the item pipeline."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from scrape_fleet.page import Page
from scrape_fleet.request import HANDLER_NAME, Request

__all__ = ["DEFAULT", "DropItem", "HandlerResult", "Router"]

Handler = Callable[[Page], Any]
Stage = Callable[[dict[str, Any], Page], Any]
#: The default handler's name in records (``record["handler"]``).
DEFAULT = "default"
#: Most text (str and bytes lengths, summed) one item may hold. Checked before encoding: a
#: JSON encoder asks for several times a huge string's size at once, which under the child's
#: address-space limit can kill the process rather than raise.
MAX_ITEM_BYTES = 4 * 1024 * 1024


class DropItem(Exception):  # noqa: N818 - the name Scrapy users know
    """Raise in an item pipeline stage to drop the item; the message is the reason recorded in
    the page's ``dropped`` list."""


@dataclass(slots=True)
class HandlerResult:
    """What one page gave: items after the pipeline, follow requests, drops and the error.

    Items and requests given before an error are kept.
    """

    handler: str | None
    items: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None


class Router:
    """Handlers by name; each page goes to one.

    Which one: the page's label (``page.follow(url, handler="product")``), else the name a
    matching rule gives (``handler: product`` in the rules file), else the first handler
    whose ``url`` pattern matches the URL, else the default.

    Example::

        router = Router()

        @router.default
        def listing(page):
            yield page.follow(page.css("a.product::attr(href)").getall(), handler="product")

        @router.handler("product")
        def product(page):
            return {"name": page.css("h1::text").get()}
    """

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.patterns: list[tuple[re.Pattern[str], str]] = []
        self.pipeline: list[Stage] = []

    def default(self, function: Handler) -> Handler:
        """Decorator: the handler for pages nothing else claims."""
        self.handlers[DEFAULT] = function
        return function

    def handler(self, name: str, *, url: str | None = None) -> Callable[[Handler], Handler]:
        """Decorator: the handler called ``name``; ``url``: a regex (``re.search`` on the page
        URL) sending unlabelled pages to it."""
        if not isinstance(name, str) or not HANDLER_NAME.fullmatch(name) or name == DEFAULT:
            raise ValueError(f"handler name {name!r}: a word of at most 64 characters, "
                             f"not {DEFAULT!r} (use @router.default)")
        if name in self.handlers:
            raise ValueError(f"handler {name!r} is declared twice")
        pattern = re.compile(url) if url is not None else None

        def register(function: Handler) -> Handler:
            self.handlers[name] = function
            if pattern is not None:
                self.patterns.append((pattern, name))
            return function

        return register

    def item(self, stage: Stage) -> Stage:
        """Decorator: an item pipeline stage, ``stage(item, page)``, run in declaration order
        on every item; it returns the item (changed or not) or raises :class:`DropItem`."""
        self.pipeline.append(stage)
        return stage

    # -- running (the fleet calls these; tests may too) ----------------------------------------
    def choose(self, page: Page, rule_handler: str | None = None) -> str:
        """The name of the handler for ``page``; KeyError saying why there is none."""
        for name, source in ((page.label, "the page's label"), (rule_handler, "its rule")):
            if name is not None:
                if name not in self.handlers:
                    raise KeyError(f"no handler named {name!r} ({source}); the router has "
                                   f"{sorted(self.handlers)}")
                return name
        for pattern, name in self.patterns:
            if pattern.search(page.url):
                return name
        if DEFAULT not in self.handlers:
            raise KeyError("no label, rule or URL pattern chose a handler, and the router "
                           "has no default")
        return DEFAULT

    def run(self, page: Page, rule_handler: str | None = None) -> HandlerResult:
        """Call the chosen handler on ``page``, check what it gives, run the pipeline."""
        try:
            name = self.choose(page, rule_handler)
        except KeyError as exc:
            return HandlerResult(None, error=f"LookupError: {exc.args[0]}")
        result = HandlerResult(name)
        try:
            for value in _values(self.handlers[name](page)):
                self._take(value, page, result)
        except MemoryError:
            raise  # the fleet's child ends and says so: no half-allocated state carries on
        except Exception as exc:  # noqa: BLE001 - user code: recorded on the page
            result.error = f"{type(exc).__name__}: {exc}"
        return result

    def _take(self, value: Any, page: Page, result: HandlerResult) -> None:
        if value is None:
            return
        if isinstance(value, Request):
            result.requests.append(value)
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if not isinstance(value, dict):
            raise TypeError(f"handler gave a {type(value).__name__}: expected an item (a dict "
                            "or a dataclass), a Request from page.follow(), or None")
        item = self._through_pipeline(value, page, result)
        if item is not None:
            result.items.append(item)

    def _through_pipeline(self, item: dict[str, Any], page: Page,
                          result: HandlerResult) -> dict[str, Any] | None:
        for stage in self.pipeline:
            name = getattr(stage, "__name__", type(stage).__name__)
            try:
                item = stage(item, page)
            except DropItem as exc:
                result.dropped.append({"reason": str(exc) or "dropped", "by": name})
                return None
            if not isinstance(item, dict):
                raise TypeError(f"item stage {name!r} returned a {type(item).__name__}: it "
                                "must return the item or raise DropItem")
        if not all(isinstance(key, str) for key in item):
            raise TypeError("an item's keys must be strings")
        size = _text_bytes(item, MAX_ITEM_BYTES)
        if size > MAX_ITEM_BYTES:
            raise ValueError(f"an item holds over {MAX_ITEM_BYTES} bytes of text; a record "
                             "keeps far less (MAX_RECORD_BYTES)")
        orjson.dumps(item)  # TypeError naming the value now, not when the record is stored
        return item


def _values(out: Any) -> Iterable[Any]:
    """A handler's return value as the values it gives: one value, a list, a generator, a
    coroutine or an async generator (each run to the end on a fresh event loop)."""
    if inspect.iscoroutine(out):
        out = asyncio.run(out)
    elif inspect.isasyncgen(out):
        out = asyncio.run(_collect(out))
    if isinstance(out, list | tuple) or inspect.isgenerator(out):
        return out
    return (out,)


def _text_bytes(value: Any, limit: int) -> int:
    """The text lengths in ``value`` (nested dicts, lists, tuples), counted until past
    ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        current = stack.pop()
        if isinstance(current, str | bytes):
            total += len(current)
        elif isinstance(current, dict):
            stack.extend(current.values())
            total += sum(len(k) for k in current if isinstance(k, str))
        elif isinstance(current, list | tuple):
            stack.extend(current)
    return total


async def _collect(agen: Any) -> list[Any]:
    return [value async for value in agen]
