"""What the user-code child runs: EXTRACTOR's function or HANDLERS's router, on one page.

Both kinds run in the same child process (common/work/user_child.py) and answer in the same
shape, so the worker's side (common/work/user_extractor.py) has one path:

    {"data": {...}, "follow": [{"urls": [...], "handler", "priority", "meta", "headers"}],
     "items": [...], "dropped": [{"reason", "by"}], "handler": "name" | null,
     "error": "Type: message"}              # "error" only when one; what came before is kept

EXTRACTOR (``package.module:function``) is a router of one default handler in all but its
record fields: it returns ``{"data", "follow", "priority"}`` (:func:`check_output`), its
values go into the record's ``data`` and its errors under ``data_errors.extractor``. HANDLERS
(``package.module:router``, a :class:`scrape_fleet.Router`) gives items and requests.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import orjson
from lxml import etree

from common.core.errors import ConfigError
from common.core.imports import import_object
from common.work.charset import decode_to_utf8
from scrape_fleet import Page, Router

if TYPE_CHECKING:  # parsel is imported when user code first asks for a selector
    from parsel import Selector

__all__ = ["PageInput", "answer", "check_output", "load_function", "load_router", "load_user_code",
           "main_content", "page_of"]

logger = logging.getLogger(__name__)

ERROR_MAX_CHARS = 200
_KEYS = frozenset({"data", "follow", "priority"})


class PageInput:
    """What an EXTRACTOR function gets: ``url`` (final), ``status``, ``headers``, ``root`` (the
    lxml root; scripts and styles already stripped), ``selector`` (parsel, on the same tree),
    ``text`` (the decoded body) and ``data`` (the EXTRACT_RULES values, or None)."""

    def __init__(self, url: str, status: int, headers: dict[str, str], body: bytes,
                 content_type: str | None, root: etree._Element,
                 data: dict[str, Any] | None) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self.root = root
        self.data = data
        self._body = body
        self._content_type = content_type

    @cached_property
    def selector(self) -> Selector:
        from parsel import Selector

        return Selector(root=self.root, type="html")

    @cached_property
    def text(self) -> str:
        return decode_to_utf8(self._body, self._content_type)[0]


def _load(setting: str, value: str, expected: str) -> Any:
    return import_object(value, f"{setting}={value!r}", expected)


def load_function(value: str) -> Any:
    """The callable an EXTRACTOR value names; ConfigError saying why it cannot be had."""
    target = _load("EXTRACTOR", value, "function")
    if not callable(target):
        raise ConfigError(f"EXTRACTOR={value!r}: {value.partition(':')[2]!r} is not callable "
                          f"(type {type(target).__name__})")
    return target


def load_router(value: str) -> Router:
    """The :class:`scrape_fleet.Router` a HANDLERS value names (ConfigError otherwise)."""
    target = _load("HANDLERS", value, "router")
    if not isinstance(target, Router):
        raise ConfigError(f"HANDLERS={value!r}: {value.partition(':')[2]!r} is a "
                          f"{type(target).__name__}, not a scrape_fleet.Router")
    if not target.handlers:
        raise ConfigError(f"HANDLERS={value!r}: the router has no handler")
    return target


def load_user_code(kind: str, value: str) -> Any:
    """EXTRACTOR's function or HANDLERS's router."""
    return load_router(value) if kind == "HANDLERS" else load_function(value)


def check_output(out: Any, base_url: str) -> tuple[dict[str, Any], list[str], bool]:
    """An EXTRACTOR function's return value checked: ``(data, follow URLs, priority)``."""
    if out is None:
        return {}, [], False
    if not isinstance(out, dict):
        raise TypeError(f"extractor returned {type(out).__name__}, expected a dict or None")
    unknown = set(out) - _KEYS
    if unknown:
        raise TypeError(f"unknown keys {sorted(unknown)}; expected data, follow, priority")
    data = out.get("data") or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise TypeError("'data' must be a dict with str keys")
    orjson.dumps(data)  # TypeError now rather than when the record is stored
    follow = out.get("follow") or []
    if not isinstance(follow, list | tuple) or not all(isinstance(u, str) for u in follow):
        raise TypeError("'follow' must be a list of URL strings")
    return data, [urljoin(base_url, u) for u in follow], bool(out.get("priority"))


def answer(code: Any, head: dict[str, Any], body: bytes, root: etree._Element,
           base_url: str) -> dict[str, Any]:
    """One page's answer (the shape in the module docstring); user exceptions become
    ``error``, MemoryError propagates (the child ends)."""
    if isinstance(code, Router):
        return _routed(code, head, body, root)
    try:
        data, follow, priority = check_output(code(PageInput(
            head["url"], head["status"], head["headers"], body, head["content_type"], root,
            head["data"])), base_url)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code: sent back as the page's error
        return {"error": _error_text(f"{type(exc).__name__}: {exc}")}
    return {"data": data, "follow": [{"urls": follow, "priority": priority}] if follow else []}


def page_of(head: dict[str, Any], body: bytes, root: etree._Element | None) -> Page:
    """The :class:`scrape_fleet.Page` of a page the worker parsed (``root``: its tree, None for
    an empty page), ``head`` as the child is sent it: url, status, headers, content_type,
    data, and label, meta, depth (a label or meta of the wrong type is ignored)."""
    from parsel import Selector  # local: only a worker with handlers runs this

    label, meta = head.get("label"), head.get("meta")
    return Page(url=head["url"], status=head["status"], headers=head["headers"],
                selector=Selector(root=root, type="html") if root is not None else None,
                text=lambda: decode_to_utf8(body, head["content_type"])[0],
                data=head["data"], depth=head.get("depth") or 0,
                label=label if isinstance(label, str) else None,
                meta=meta if isinstance(meta, dict) else None, content=main_content)


def _routed(router: Router, head: dict[str, Any], body: bytes,
            root: etree._Element) -> dict[str, Any]:
    result = router.run(page_of(head, body, root), head.get("rule_handler"))
    reply: dict[str, Any] = {"handler": result.handler, "items": result.items,
                             "follow": [r.wire() for r in result.requests if r.urls],
                             "dropped": result.dropped}
    if result.error is not None:
        reply["error"] = _error_text(result.error)
    return reply


def main_content(html: str, url: str, output: str) -> str | None:
    """``page.main_text`` / ``page.markdown``: common/work/content.py, imported on first use
    (trafilatura costs ~0.3 s to import; only pages that ask pay it)."""
    from common.work.content import extract_main  # noqa: PLC0415 - lazy by design

    return extract_main(html, url, output)


def _error_text(text: str) -> str:
    return text[:ERROR_MAX_CHARS].encode("utf-8", "backslashreplace").decode()
